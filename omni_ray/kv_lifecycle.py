"""The KV-transfer lifecycle of one disaggregated request (thinker prefill -> decode).

Torch-free and Ray-free: the ingress owns one ``KVTransfer`` per request and moves it through
explicit states; every illegal move raises ``IllegalKVTransition``, so a double release or a step
taken after an abort fails loudly instead of corrupting state.

    REQUESTED -> HELD -> EXTRACTED -> TRANSFERRED -> LOADED -> RELEASED
    any state before LOADED   -> FAILED   (a step failed or timed out)
    any state before RELEASED -> ABORTED  (client gone, server abort)

Who frees what (each side only its own, never the other's):

* the **sender** (prefill engine) frees its ``DynamicCache`` itself, right after its own save
  (extraction + ``ray.put``) finished or failed; nobody else can trigger that release, so a failed
  or timed-out load can never free a cache whose save is still running;
* the **object-store copy** lives while the ingress holds the ref: ``ref_held`` is true exactly in
  EXTRACTED, TRANSFERRED and LOADED; the ingress drops it on RELEASED, FAILED or ABORTED;
* the **receiver** (decode engine) frees what it fetched or loaded: its staged copy when the load
  finished, failed, expired or was aborted, and the loaded cache when the request ends.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable


class KVState(enum.Enum):
    REQUESTED = "requested"      # the ingress asked a prefill replica to run the prompt
    HELD = "held"                # the sender ran the prompt; it holds the request's KV cache
    EXTRACTED = "extracted"      # the sender's save is done (prompt KV copied out, put in the
                                 # object store) and it freed its cache; the ingress holds the ref
    TRANSFERRED = "transferred"  # the receiver fetched the bytes into a local staged copy
    LOADED = "loaded"            # the receiver's runner has the request, prefilled from the KV
    RELEASED = "released"        # the ingress dropped its ref: the object-store copy can go
    FAILED = "failed"            # a step failed or timed out (see ``KVTransfer.error``)
    ABORTED = "aborted"          # the request was aborted (client gone, injected abort)

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def ref_held(self) -> bool:
        """Whether the ingress holds the object-store ref in this state."""
        return self in (KVState.EXTRACTED, KVState.TRANSFERRED, KVState.LOADED)


_TERMINAL = frozenset({KVState.RELEASED, KVState.FAILED, KVState.ABORTED})
_FORWARD = {
    KVState.REQUESTED: KVState.HELD,
    KVState.HELD: KVState.EXTRACTED,
    KVState.EXTRACTED: KVState.TRANSFERRED,
    KVState.TRANSFERRED: KVState.LOADED,
    KVState.LOADED: KVState.RELEASED,
}
# Every legal move: one step forward, or to FAILED / ABORTED from a state that is not terminal.
# LOADED cannot fail: the only thing left is dropping the ref, which cannot fail.
TRANSITIONS: dict[KVState, frozenset[KVState]] = {
    s: frozenset({_FORWARD[s], KVState.ABORTED}
                 | ({KVState.FAILED} if s is not KVState.LOADED else set()))
    for s in _FORWARD
} | {s: frozenset() for s in _TERMINAL}


class IllegalKVTransition(RuntimeError):
    """A move the lifecycle does not allow (a bug in the caller, never a request error)."""


class KVStepError(RuntimeError):
    """A hand-off step failed cleanly: the side that raised it holds nothing of the request."""


class KVExtractError(KVStepError):
    """The sender could not extract a request's KV (it still frees its cache itself)."""


class KVTransferError(KVStepError):
    """The receiver could not get the KV: timed out, lost (owner died), or not the request's."""


class KVLoadError(KVStepError):
    """The receiver could not load the KV; the request never reached its runner."""


class KVTransfer:
    """One request's KV hand-off as the ingress sees it: its state, timings and outcome."""

    def __init__(self, request_id: str, clock: Callable[[], float] = time.monotonic):
        self.request_id = request_id
        self._clock = clock
        self.state = KVState.REQUESTED
        self.history: list[tuple[KVState, float]] = [(KVState.REQUESTED, clock())]
        self.error: str | None = None
        self.failed_at: KVState | None = None  # the state a FAILED / ABORTED transfer was in
        self.num_tokens = 0
        self.nbytes = 0
        self.fallback = False  # the request went on with a local prefill after a failure
        self.marks: dict[str, float] = {}  # named moments inside a state, for timings

    def mark(self, name: str) -> None:
        """Note a moment that is not a state change (e.g. the decode replica opened)."""
        self.marks[name] = self._clock()

    def can(self, to: KVState) -> bool:
        return to in TRANSITIONS[self.state]

    def advance(self, to: KVState) -> None:
        """Move to ``to``; raise ``IllegalKVTransition`` if that is not a legal move."""
        if not self.can(to):
            raise IllegalKVTransition(
                f"{self.request_id}: KV transfer cannot go {self.state.name} -> {to.name}")
        if to in (KVState.FAILED, KVState.ABORTED):
            self.failed_at = self.state
        self.state = to
        self.history.append((to, self._clock()))

    def fail(self, error: str) -> None:
        self.error = error
        self.advance(KVState.FAILED)

    def abort(self, reason: str) -> None:
        self.error = reason
        self.advance(KVState.ABORTED)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def ref_held(self) -> bool:
        return self.state.ref_held

    def entered(self, state: KVState) -> float | None:
        """Clock time at which the transfer entered ``state`` (None if it never did)."""
        return next((t for s, t in self.history if s is state), None)

    def seconds(self, start: KVState, end: KVState) -> float | None:
        a, b = self.entered(start), self.entered(end)
        return None if a is None or b is None else b - a

    @property
    def handoff_s(self) -> float | None:
        """Hand-off latency: the sender's save done (EXTRACTED) -> the receiver loaded."""
        return self.seconds(KVState.EXTRACTED, KVState.LOADED)

    def summary(self) -> dict:
        return dict(request_id=self.request_id, state=self.state.name,
                    failed_at=self.failed_at.name if self.failed_at else None, error=self.error,
                    fallback=self.fallback, num_tokens=self.num_tokens, nbytes=self.nbytes,
                    prefill_s=self.seconds(KVState.REQUESTED, KVState.HELD),
                    save_s=self.seconds(KVState.HELD, KVState.EXTRACTED),
                    fetch_s=self.seconds(KVState.EXTRACTED, KVState.TRANSFERRED),
                    decode_open_s=(self.marks["decode_opened"] - self.entered(KVState.EXTRACTED)
                                   if "decode_opened" in self.marks and
                                   self.entered(KVState.EXTRACTED) is not None else None),
                    load_s=self.seconds(KVState.TRANSFERRED, KVState.LOADED),
                    handoff_s=self.handoff_s)


class KVTransferTable:
    """The ingress's live transfers (one per request) plus outcome counters."""

    def __init__(self, keep_recent: int = 256, clock: Callable[[], float] = time.monotonic):
        self._live: dict[str, KVTransfer] = {}
        self._clock = clock
        self.recent: deque[dict] = deque(maxlen=keep_recent)  # summaries of finished transfers
        self.counts = {s.name.lower(): 0 for s in _TERMINAL} | {"fallbacks": 0}

    def start(self, request_id: str) -> KVTransfer:
        if request_id in self._live:
            raise ValueError(f"duplicate KV transfer for request {request_id!r}")
        t = self._live[request_id] = KVTransfer(request_id, self._clock)
        return t

    def finish(self, transfer: KVTransfer) -> None:
        """Forget a transfer that reached a terminal state (raises if it has not)."""
        if not transfer.terminal:
            raise IllegalKVTransition(
                f"{transfer.request_id}: finish() in non-terminal state {transfer.state.name}")
        if self._live.get(transfer.request_id) is transfer:
            del self._live[transfer.request_id]
            self.counts[transfer.state.name.lower()] += 1
            self.counts["fallbacks"] += transfer.fallback
            self.recent.append(transfer.summary())

    def get(self, request_id: str) -> KVTransfer | None:
        return self._live.get(request_id)

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def refs_held(self) -> int:
        return sum(t.ref_held for t in self._live.values())

    def stats(self) -> dict:
        return dict(kv_transfers_live=self.live, kv_refs_held=self.refs_held,
                    **{f"kv_{k}": v for k, v in self.counts.items()})
