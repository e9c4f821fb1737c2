"""Fault injection, for tests only: every failure omni_ray stages on purpose is decided here.

The switch is ``security.allow_fault_injection`` (off by default), read in one place:
``requested`` is the only reader of the ``x-omni-fault`` / ``x-omni-kv-fault`` headers and gives
nothing when the switch is off. A request without a fault never reaches the hooks below; the
production paths call them only with the fault a test asked for (docs/security.md,
docs/kv_transfer.md "Fault injection").

* ``x-omni-fault: <stage>``: that stage fails the request on its next step (``fail_next_step``).
* ``x-omni-kv-fault``: a KV hand-off failure (``KVFault``): the sender dies holding the KV, the
  extraction, transfer or load fails, the request is aborted right after entering a state, or
  it is aborted once the sender's save has reached the ingress, unread (``abort_unread``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omni_ray.kv_lifecycle import KVState

STAGE_FAULT_HEADER = "x-omni-fault"
KV_FAULT_HEADER = "x-omni-kv-fault"
FAULT_KINDS = ("prefill_dies", "extract_fails", "transfer_timeout", "load_fails", "abort_unread")
STUCK_S = 60.0  # how long a "dying" sender stalls before giving up by itself
SAVE_LANDS_S = 1.0  # ``abort_unread``: ample for the sender's save to reach the ingress's stream


def requested(headers: Mapping[str, str], allowed: bool) -> tuple[str | None, str | None]:
    """``(stage fault, KV fault)`` header values of a request; both None unless ``allowed``
    (the app's ``security.allow_fault_injection``)."""
    if not allowed:
        return None, None
    return headers.get(STAGE_FAULT_HEADER), headers.get(KV_FAULT_HEADER)


@dataclass(frozen=True)
class KVFault:
    """A parsed ``x-omni-kv-fault`` header: one failure kind, or an abort at one state."""

    kind: str | None = None              # one of FAULT_KINDS
    abort_at: KVState | None = None      # abort the request right after entering this state

    @classmethod
    def parse(cls, value: str) -> KVFault:
        """``prefill_dies | extract_fails | transfer_timeout | load_fails | abort_unread |
        abort_at:<STATE>``."""
        v = value.strip()
        if v in FAULT_KINDS:
            return cls(kind=v)
        if v.lower().startswith("abort_at:"):
            name = v.split(":", 1)[1].strip().upper()
            state = KVState.__members__.get(name)
            if state is None or state in (KVState.FAILED, KVState.ABORTED):
                allowed = [s.name for s in KVState if s not in (KVState.FAILED, KVState.ABORTED)]
                raise ValueError(f"abort_at: unknown state {name!r}; one of {allowed}")
            return cls(abort_at=state)
        raise ValueError(f"unknown KV fault {value!r}; one of {list(FAULT_KINDS)} "
                         "or abort_at:<STATE>")


# -- the hooks the KV hand-off calls with a request's fault kind (None: no fault) ----------------
def extract_fails(fault: str | None) -> bool:
    """The sender's KV extraction raises (``extract_fails``)."""
    return fault == "extract_fails"


def transfer_delay_s(fault: str | None, transfer_s: float) -> float:
    """Seconds the receiver's fetch is held back: past its timeout ``transfer_s`` for
    ``transfer_timeout``, else none."""
    return transfer_s + 1.0 if fault == "transfer_timeout" else 0.0


async def abort_unread(fault: str | None) -> bool:
    """``abort_unread``, in the ingress once the sender holds the KV (HELD): True after the save
    has had time to reach the ingress's stream; the ingress then aborts the request without
    reading it (the EXTRACTED item, with the object's ref inside, left in the stream)."""
    if fault != "abort_unread":
        return False
    await asyncio.sleep(SAVE_LANDS_S)
    return True


def load_fails(fault: str | None) -> bool:
    """The receiver's KV load raises (``load_fails``)."""
    return fault == "load_fails"


async def sender_stalls(fault: str | None) -> None:
    """``prefill_dies``, in the sender: hold the KV (the replica kills this actor meanwhile,
    ``kill_sender``); give up by itself after ``STUCK_S``."""
    if fault == "prefill_dies":
        await asyncio.sleep(STUCK_S)


def kill_sender(fault: str | None, state: KVState, engine: Any) -> None:
    """``prefill_dies``, in the prefill replica: kill the sender's engine actor once it holds the
    KV (HELD); the replica then sees it die as in a real crash."""
    if fault == "prefill_dies" and state is KVState.HELD:
        import ray

        ray.kill(engine, no_restart=True)
