"""Engine actors of a disaggregated thinker: the KV sender (prefill) and receiver (decode).

Both are ``StageEngine``s (same loop thread, command queue and stats), so every touch of a cache
happens on the one thread that owns the model, in command order.

Each side frees only its own state:

* ``PrefillEngine.prefill`` runs the prompt (HELD), extracts a copy and ``ray.put``s it (its save),
  then releases the cache itself. The release is queued behind the extraction on the loop thread,
  so even a cancelled call cannot free a cache that is still being read; nobody else can free it.
* ``DecodeEngine`` frees what it received: the staged copy (on load, failure, abort or expiry)
  and the loaded cache (when the request ends, as for any thinker request).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import KVTimeouts
from omni_ray.kv_lifecycle import KVLoadError, KVState, KVTransferError
from omni_ray.metrics import EngineMetrics
from omni_ray.payload import KVChunk
from omni_ray.pipeline.emit import StageRequestError
from omni_ray.pipeline.kv import DecodeThinkerLogic, PrefillLogic
from omni_ray.stages.engine import StageEngine
from omni_ray.testing import faults
from omni_ray.transport.kv_ref import KVProgress, fetch_kv, put_kv



class PrefillEngine(StageEngine):
    """The KV sender: ``prefill(request)`` streams ``KVProgress`` HELD, then EXTRACTED."""

    kv_transfer = True

    def __init__(self, stage: str, model_dir: str, stage_cfg, pipeline, max_model_len: int = 8192):
        super().__init__("thinker", model_dir, stage_cfg, pipeline, max_model_len)
        self.stage = stage
        self.metrics = EngineMetrics(stage)  # its own series, not the decode thinker's
        self.logic = PrefillLogic(self.logic.runner)
        self._active: set[str] = set()
        self._owned: set[str] = set()  # hex ids of KV objects this process put (owner side)
        self.counters.update(prefills=0, kv_saves=0, kv_save_failures=0, kv_bytes_out=0)

    async def prefill(self, request: OmniRequest, fault: str | None = None):
        """Async generator: ``KVProgress(HELD)`` once the prompt ran, then ``KVProgress(EXTRACTED)``
        with the ``KVHandle`` once the save is done and the cache freed; raises on failure (the
        cache is freed then too). ``fault`` is fault injection (tests only)."""
        self._ensure_thread()
        rid = request.request_id
        if rid in self._active:
            raise ValueError(f"duplicate request_id {rid!r}")
        self._active.add(rid)
        self.metrics.on_requests(self._active)
        n = len(request.prompt_token_ids)
        released = False
        try:
            # 1) Run the prompt; the logic holds the cache from here (HELD).
            t0 = time.perf_counter()
            first = await self._call(lambda: self.logic.prefill(request))
            self.counters["prefills"] += 1
            self.metrics.on_step(1, self._active)  # a prefill is a step of one request
            yield KVProgress(rid, KVState.HELD, first, n, time.perf_counter() - t0)
            if fault is not None:  # tests only (omni_ray/testing/faults.py)
                await faults.sender_stalls(fault)
            # 2) The save: extract a CPU copy on the loop thread, then put it in the object store.
            t1 = time.perf_counter()
            chunk = await self._call(lambda: self.logic.extract(rid, fail=faults.extract_fails(fault)))
            handle = put_kv(chunk)
            del chunk
            self._owned.add(handle.ref.hex())
            # 3) Our save is complete: free our cache (our own release, nobody else's).
            released = await self._call(lambda: self.logic.release(rid))
            self.counters["kv_saves"] += 1
            self.counters["kv_bytes_out"] += handle.nbytes
            yield KVProgress(rid, KVState.EXTRACTED, first, n, time.perf_counter() - t1, handle)
        except Exception:
            self.counters["kv_save_failures"] += 1
            raise
        finally:
            self._active.discard(rid)
            self.metrics.on_requests(self._active)
            if not released:  # queued behind any extraction still running: never mid-save
                self._post(lambda: self.logic.release(rid))

    def _admitted(self):
        return self._active

    async def stats(self) -> dict:
        s = await super().stats()
        s.update(requests=len(self._active), kv_held=s["runner_requests"],
                 kv_refs_owned=self._refs_owned())
        return s

    def _refs_owned(self) -> int:
        """How many KV objects this process put are still referenced anywhere (0 when every
        ingress dropped its ref and every fetch finished)."""
        try:
            import ray

            counts = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
        except Exception:  # private API: report unknown rather than fail stats
            return -1
        self._owned = {h for h in self._owned if h.encode() in counts}
        return len(self._owned)


@dataclass
class _KVSlot:
    """A decode request waiting for its KV: waiting -> fetching -> staged -> loading."""

    request: OmniRequest
    has_downstream: bool
    state: str = "waiting"
    chunk: KVChunk | None = None  # the staged copy (state "staged")
    timer: asyncio.TimerHandle | None = None


class DecodeEngine(StageEngine):
    """The KV receiver: a thinker engine whose requests may start from a transferred KV.

    ``add_request(request, downstream, expect_kv=True)`` registers the request without running
    its prompt; the ingress then calls ``fetch_kv`` (TRANSFERRED) and ``load_kv`` (LOADED) on this
    actor, and the request streams as any thinker request. A request whose KV is not staged within
    ``transfer_s + load_s`` of registering fails by itself; one whose load raised never ran.
    """

    kv_transfer = True

    def __init__(self, stage: str, model_dir: str, stage_cfg, pipeline, max_model_len: int = 8192,
                 timeouts: KVTimeouts | None = None):
        super().__init__("thinker", model_dir, stage_cfg, pipeline, max_model_len)
        self.stage = stage
        self.metrics = EngineMetrics(stage)
        self.logic = DecodeThinkerLogic(self.logic.runner, pipeline)
        self.timeouts = timeouts or KVTimeouts()
        self._kv: dict[str, _KVSlot] = {}
        self.counters.update(kv_fetches=0, kv_loads=0, kv_failures=0, kv_expired=0,
                             kv_bytes_in=0)

    async def add_request(self, request: OmniRequest, downstream=None,
                          expect_kv: bool = False) -> None:
        if not expect_kv:
            return await super().add_request(request, downstream)
        self._ensure_thread()
        rid = request.request_id
        self._check_new(rid)
        st = self._reqs[rid] = self._new_state(rid, downstream)
        slot = self._kv[rid] = _KVSlot(request, downstream is not None)
        wait_s = self.timeouts.transfer_s + self.timeouts.load_s
        slot.timer = self._loop.call_later(wait_s, self._expire, rid, slot)
        self._expect_stream(rid, st)

    async def fetch_kv(self, request_id: str, handle, fault: str | None = None) -> dict:
        """Fetch the request's KV into a staged local copy (TRANSFERRED); raises
        ``KVTransferError`` (and fails the request here) on timeout or loss."""
        slot = self._advance_slot(request_id, "waiting", "fetching")
        delay = faults.transfer_delay_s(fault, self.timeouts.transfer_s)
        try:
            chunk, seconds = await fetch_kv(handle, self.timeouts.transfer_s, delay)
        except BaseException as e:
            self._fail_kv(request_id, slot, f"KV transfer failed: {e}")
            raise
        if self._kv.get(request_id) is not slot:
            raise KVTransferError("request aborted or expired while its KV was in flight")
        slot.chunk, slot.state = chunk, "staged"
        self.counters["kv_fetches"] += 1
        self.counters["kv_bytes_in"] += handle.nbytes
        return dict(nbytes=handle.nbytes, seconds=seconds)

    async def load_kv(self, request_id: str, fault: str | None = None) -> dict:
        """Build the cache from the staged copy and start the request (LOADED). On
        ``KVLoadError`` the request never reached the runner and is failed here."""
        slot = self._advance_slot(request_id, "staged", "loading")
        st = self._reqs.get(request_id)
        chunk, slot.chunk = slot.chunk, None
        t0 = time.perf_counter()
        try:
            await self._call(lambda: self.logic.add_prefilled(
                slot.request, slot.has_downstream, chunk, fail=faults.load_fails(fault)))
        except BaseException as e:
            self._fail_kv(request_id, slot, f"KV load failed: {e}")
            raise
        finally:
            del chunk  # the staged copy now lives on only as the runner's cache
        if self._kv.get(request_id) is not slot or self._reqs.get(request_id) is not st:
            self._post(lambda: self.logic.abort(request_id))
            raise KVLoadError("request aborted while its KV was loading")
        del self._kv[request_id]
        slot.timer.cancel()
        self.counters["kv_loads"] += 1
        return dict(seconds=time.perf_counter() - t0)

    async def abort(self, request_id: str) -> bool:
        slot = self._kv.pop(request_id, None)
        if slot is not None:
            slot.timer.cancel()
            slot.chunk = None
        return await super().abort(request_id) or slot is not None

    async def stats(self) -> dict:
        s = await super().stats()
        s.update(kv_waiting=len(self._kv),
                 kv_held=sum(slot.chunk is not None for slot in self._kv.values()))
        return s

    # -- internals -----------------------------------------------------------------------------
    def _advance_slot(self, request_id: str, expected: str, new: str) -> _KVSlot:
        slot = self._kv.get(request_id)
        if slot is None or slot.state != expected:
            state = None if slot is None else slot.state
            raise KVTransferError(f"{request_id!r} is not {expected} for KV here (state {state})")
        slot.state = new
        return slot

    def _expire(self, request_id: str, slot: _KVSlot) -> None:
        # A load in progress is bounded by the ingress's wait; failing it here could race its
        # first step, so only requests still short of loading expire.
        if self._kv.get(request_id) is slot and slot.state != "loading":
            self.counters["kv_expired"] += 1
            wait_s = self.timeouts.transfer_s + self.timeouts.load_s
            self._fail_kv(request_id, slot, f"no KV loaded within {wait_s:g}s")

    def _fail_kv(self, request_id: str, slot: _KVSlot, msg: str) -> None:
        """End a request whose hand-off failed: drop the staged copy, make sure the runner holds
        nothing of it (queued after any load), and end its stream with the error."""
        if self._kv.get(request_id) is not slot:
            return  # already aborted, expired or failed
        del self._kv[request_id]
        slot.timer.cancel()
        slot.chunk = None
        self.counters["kv_failures"] += 1
        self._post(lambda: self.logic.abort(request_id))
        st = self._reqs.get(request_id)
        if st is not None and not st.finished:
            st.finished = True
            if st.sender is not None:
                st.sender.cancel()
            st.out.put_nowait(StageRequestError(f"{self.stage}: {msg}"))
