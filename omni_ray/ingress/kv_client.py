"""The ingress side of thinker prefill/decode disaggregation: it owns each request's KV hand-off.

``DisaggPipelineClient`` opens the talker and code2wav as usual, then replaces the thinker's open
with a hand-off driven through a ``KVTransfer`` (omni_ray/kv_lifecycle.py), every wait bounded:

1. REQUESTED -> HELD -> EXTRACTED: one ``ThinkerPrefill`` replica runs the prompt, saves the KV
   (``ray.put``) and frees its cache; the ingress now holds the only long-lived ref.
2. -> TRANSFERRED: one ``ThinkerDecode`` replica registers the request (``open(...,
   expect_kv=True)`` yields its engine handle) and the ingress hands that engine the ref in one
   short call (``fetch_kv``), so no long-running task pins the object.
3. -> LOADED -> RELEASED: the engine loads the KV into its runner (``load_kv``); the ingress drops
   the ref, and the decode stream goes on like a thinker's.

A failure before the decode runner could have started the request falls back to a local prefill
on a decode replica (``fallback: local_prefill``, same answer) or ends the request with a
``StageError`` naming the state (``fallback: error``). When the ingress cannot know whether the
decode runner started (its own timeout on ``load_kv``, the decode engine died), it always ends
the request: a second thinker stream into the same talker would duplicate chunks. The ingress
never asks the sender to release anything; any abort or failure only drops the ingress's ref,
cancels the decode call it made and reads the prefill stream to its end in the background
(``_drain``: a stream dropped half-read can keep the KV object referenced). Before a local
prefill, the failed attempt's decode call is read to its end instead of cancelled (``_ended``):
the decode engine has already ended the request, and the local prefill reuses its id on the same
deployment, where a cancel's late abort would refuse or kill it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import ThinkerDisaggConfig
from omni_ray.ingress.pipeline_client import (
    PipelineClient,
    PipelineStream,
    StageError,
    StageUnavailable,
    _first,
    _root,
)
from omni_ray.kv_lifecycle import KVState, KVStepError, KVTransfer, KVTransferTable
from omni_ray.testing import faults
from omni_ray.testing.faults import KVFault

logger = logging.getLogger("ray.serve")

RECENT_IN_STATS = 4  # finished hand-offs shown in /debug/stats (kv_ingress.recent)
GRACE_S = 5.0  # the ingress waits this much longer than the engine-side bounds: engines fail first
_NO_FAULT = KVFault()


class KVHandoffFailed(Exception):
    """A hand-off step failed; ``fallback_safe`` when no decode runner can have started it."""

    def __init__(self, message: str, fallback_safe: bool):
        super().__init__(message, fallback_safe)
        self.message, self.fallback_safe = message, fallback_safe


class KVInjectedAbort(StageError):
    """Fault injection: the request is aborted right after its transfer entered a state."""


class DisaggPipelineClient(PipelineClient):
    def __init__(self, prefill, decode, talker, code2wav, cfg: ThinkerDisaggConfig,
                 timeline=None):
        # the decode deployment plays the thinker
        super().__init__(decode, talker, code2wav, timeline)
        self.prefill = prefill
        self.cfg = cfg
        self.transfers = KVTransferTable()
        self._faults: dict[str, KVFault] = {}
        self._drains: set[asyncio.Task] = set()  # prefill streams read to their end (_drain)

    async def open(self, req: OmniRequest, kv_fault: KVFault | None = None) -> PipelineStream:
        """As ``PipelineClient.open``; ``kv_fault`` injects a hand-off fault (tests only)."""
        if kv_fault is None:
            return await super().open(req)
        self._faults[req.request_id] = kv_fault
        try:
            return await super().open(req)
        finally:
            self._faults.pop(req.request_id, None)

    def stats(self) -> dict:
        """Counts, plus ``recent``: the summaries of the last few finished hand-offs (state,
        ``failed_at``, ``error``, ``fallback`` and the seconds of each step)."""
        return {**self.transfers.stats(), "kv_streams_draining": len(self._drains),
                "recent": list(self.transfers.recent)[-RECENT_IN_STATS:]}

    async def _open_thinker(self, req: OmniRequest, downstream, gens: list):
        t = self.transfers.start(req.request_id)
        try:
            return await self._handoff(req, downstream, gens, t,
                                       self._faults.get(req.request_id, _NO_FAULT))
        except KVHandoffFailed as e:
            if not (self.cfg.fallback == "local_prefill" and e.fallback_safe):
                raise StageError("thinker", f"KV hand-off failed at {t.failed_at.name}: "
                                            f"{t.error}") from None
            logger.warning("request %s: KV hand-off failed at %s (%s); prefilling locally",
                           req.request_id, t.failed_at.name, t.error)
            t.fallback = True
            return await super()._open_thinker(req, downstream, gens)
        except BaseException as e:  # cancelled, client gone, injected abort, refused
            if not t.terminal:
                t.abort(f"{type(e).__name__}: {e}")
            raise
        finally:
            self.transfers.finish(t)

    async def _handoff(self, req: OmniRequest, downstream, gens: list, t: KVTransfer,
                       fault: KVFault):
        """The hand-off; the decode engine's handle."""
        rid, to = req.request_id, self.cfg.timeouts
        loop = asyncio.get_running_loop()
        pre = th = handle = ev = None
        deadline = loop.time() + to.prefill_s
        try:
            # 1) REQUESTED: a prefill replica runs the prompt (HELD) and saves its KV (EXTRACTED).
            pre = self.prefill.options(stream=True).prefill.remote(req, fault.kind)
            self._abort_if(fault, t)
            ev = await self._wait(t, pre.__anext__(), deadline - loop.time(), "prefill")
            self._expect(t, ev, KVState.HELD)
            t.num_tokens = ev.num_tokens
            t.advance(KVState.HELD)
            self._abort_if(fault, t)
            if await faults.abort_unread(fault.kind):
                raise KVInjectedAbort("thinker", "request aborted with its saved KV unread "
                                                 "(x-omni-kv-fault)")
            ev = await self._wait(t, pre.__anext__(), deadline - loop.time(), "KV save")
            self._expect(t, ev, KVState.EXTRACTED)
            handle, ev = ev.handle, None
            t.nbytes = handle.nbytes
            t.advance(KVState.EXTRACTED)
            self._abort_if(fault, t)
            # 2) A decode replica registers the request; its engine fetches the KV (TRANSFERRED).
            th = self.thinker.options(stream=True).open.remote(req, downstream, expect_kv=True)
            # Timed out: the decode engine may still register the id, so no local prefill of it.
            engine = await self._wait(t, _first(th, "thinker"), to.load_s + GRACE_S, "decode open",
                                      safe=lambda e: e is not None)
            t.mark("decode_opened")
            await self._wait(t, engine.fetch_kv.remote(rid, handle, fault.kind),
                             to.transfer_s + GRACE_S, "KV transfer")
            t.advance(KVState.TRANSFERRED)
            self._abort_if(fault, t)
            # 3) It loads the KV into its runner (LOADED); our ref can go (RELEASED).
            await self._wait(t, engine.load_kv.remote(rid, fault.kind), to.load_s + GRACE_S,
                             "KV load", safe=_load_error_is_clean)
            t.advance(KVState.LOADED)
            self._abort_if(fault, t)
            handle = None
            t.advance(KVState.RELEASED)
            gens.append(("thinker", th))
            th = None
            self._abort_if(fault, t)
            return engine
        except KVHandoffFailed as e:
            if th is not None and e.fallback_safe and self.cfg.fallback == "local_prefill":
                # The engine fails a request whose fetch or load failed, or that waited too long
                # for its KV (kv_engine.py): its stream ends within transfer_s + load_s.
                if await _ended(th, to.transfer_s + to.load_s + GRACE_S):
                    th = None
                else:
                    e.fallback_safe = False
                    logger.warning("request %s: the decode replica did not end its failed "
                                   "hand-off; no local prefill", rid)
            raise
        finally:
            handle = ev = None  # tracebacks keep frames alive: never let one pin the object
            if pre is not None:  # the sender finishes its save and frees its cache by itself
                self._drain(pre, deadline)
            if th is not None:
                th.cancel()  # the decode replica aborts the request and drops what it got

    def _drain(self, pre, deadline: float) -> None:
        """Read the prefill stream to its end in the background rather than cancel it. The
        sender saves and frees by itself either way, but a stream dropped while its EXTRACTED
        item is on the way can leave that item, and the KV object its handle names, referenced
        for good (seen under load in tests/serve/test_kv_disagg_state.py). Bounded by the
        prefill's deadline; past it the call is cancelled."""

        async def drain():
            try:
                async with asyncio.timeout_at(deadline + GRACE_S):
                    async for _ in pre:
                        pass
            except BaseException:  # noqa: BLE001  (failed, timed out or shut down: stop it)
                pre.cancel()

        task = asyncio.get_running_loop().create_task(drain())
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _wait(self, t: KVTransfer, aw, timeout_s: float, what: str,
                    safe: bool | Callable[[BaseException | None], bool] = True):
        """Await one hand-off step; failures become ``KVHandoffFailed`` (t -> FAILED)."""
        is_safe = safe if callable(safe) else (lambda _e: safe)
        try:
            return await asyncio.wait_for(aw, max(timeout_s, 0.001))
        except (StageUnavailable, ValueError) as e:  # refusals keep their own answer (503 / 400)
            t.fail(f"{what}: {e}")
            raise
        except asyncio.TimeoutError:
            msg = f"{what} timed out after {timeout_s:.3g}s"
            t.fail(msg)
            raise KVHandoffFailed(msg, is_safe(None)) from None
        except StopAsyncIteration:
            msg = f"{what}: stream ended early"
            t.fail(msg)
            raise KVHandoffFailed(msg, True) from None
        except Exception as e:
            root = _root(e)
            msg = f"{what} failed: {type(root).__name__}: {_first_line(root)}"
            t.fail(msg)
            raise KVHandoffFailed(msg, is_safe(root)) from None

    @staticmethod
    def _expect(t: KVTransfer, ev, state: KVState) -> None:
        if getattr(ev, "state", None) is not state:
            msg = f"expected {state.name} from the prefill replica, got {ev!r:.200}"
            t.fail(msg)
            raise KVHandoffFailed(msg, True)

    @staticmethod
    def _abort_if(fault: KVFault, t: KVTransfer) -> None:
        if fault.abort_at is t.state:
            raise KVInjectedAbort("thinker", f"request aborted at {t.state.name} "
                                             "(x-omni-kv-fault)")


async def _ended(gen, timeout_s: float) -> bool:
    """Read a stage call to its end (its error included); False if it is still going after
    ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            async for _ in gen:
                pass
    except TimeoutError:
        return False
    except Exception:  # noqa: BLE001  (the failure the engine ended it with)
        pass
    return True


def kv_fault_from_header(value: str | None, client: PipelineClient) -> KVFault | None:
    """The parsed ``x-omni-kv-fault`` header (None if absent); ``ValueError`` when it is
    malformed or this app does not disaggregate its thinker."""
    if not value:
        return None
    if not isinstance(client, DisaggPipelineClient):
        raise ValueError("x-omni-kv-fault: thinker_disaggregation is not enabled")
    return KVFault.parse(value)


def _load_error_is_clean(e: BaseException | None) -> bool:
    """The decode engine raises these only when the request never reached its runner; anything
    else (our timeout, the actor gone) leaves that unknown."""
    return isinstance(e, KVStepError)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
