"""The engine actor: owns one stage replica's model and runs its step loop.

A Serve replica creates one ``StageEngine`` actor and is its control plane; the data plane runs
between engine actors: the upstream engine pushes chunks straight into ``push`` here, and this
engine pushes its own output to the next stage's engine. The runner lives on one thread
(``_loop_thread``); everything else (request table, senders, output queues) lives on the actor's
asyncio loop, and the two talk through a command queue and ``call_soon_threadsafe``.

Streaming convention of ``stream(request_id)``: yields lists of encoded payload chunks
(``TextDelta`` from the thinker, ``AudioChunk`` from code2wav, nothing from the talker), each list
everything queued when the reader came back, at most one list per ``stream_interval_ms`` (the
first item at once: one Ray item per batch of tokens, not per token), and ends after the
request's final item; a failed request
raises ``StageRequestError`` from the generator instead, after the items queued before it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from omni_ray.config.request import DOWNSTREAM_LATER, WARMUP_ID_PREFIX, OmniRequest
from omni_ray.metrics import EngineMetrics
from omni_ray.mps import PRIORITY_ENV, SM_PERCENT_ENV
from omni_ray.payload import decode_chunk, encode_chunk
from omni_ray.pipeline.build import build_stage_logic
from omni_ray.runners.factory import warm_up_runner
from omni_ray.pipeline.emit import Emit, StageRequestError
from omni_ray.stages import gc_clock
from omni_ray.stages.gpu_start import gpu_start_turn
from omni_ray.stages.step_trace import StepTrace
from omni_ray.stages.tombstones import Tombstones
from omni_ray.timeline import Timeline
from omni_ray.transport.ray_push import ChunkSender, PushBatcher, Reorderer

_END = object()
UNCLAIMED_S = 5.0  # an added request that no stream() claims in this long is aborted
_NEXT_STAGE = {"thinker": "talker", "talker": "code2wav"}


@dataclass
class _ReqState:
    request_id: str
    out: asyncio.Queue
    sender: ChunkSender | None
    reorder: Reorderer = field(default_factory=Reorderer)
    finished: bool = False
    aborted: bool = False
    abort_started: bool = False  # abort() ran once: the stream's end and the replica's cancel
    claimed: bool = False  # a stream() reads it (else it is reaped after UNCLAIMED_S)
    downstream_later: asyncio.Future | None = None  # set by attach() (DOWNSTREAM_LATER)
    t_added: float = field(default_factory=time.monotonic)


class StageEngine:
    """Ray actor body (created with ``ray.remote(StageEngine).options(...)`` by the replica)."""

    kv_transfer = False  # the disaggregated thinker's engines (kv_engine.py) hand KV over

    def __init__(self, stage: str, model_dir: str, stage_cfg, pipeline, max_model_len: int = 8192):
        self.stage = stage
        self.pipeline = pipeline
        _log_to_stderr()
        # On a GPU the load waits for its turn: starts sharing a GPU never overlap.
        t0 = time.perf_counter()
        with gpu_start_turn(stage_cfg.device, stage):
            t1 = time.perf_counter()
            self.logic = build_stage_logic(stage, model_dir, stage_cfg, pipeline, max_model_len,
                                           kv_transfer=self.kv_transfer, warm_up=False)
        # The runner's warm-up (graph captures) after the turn: the next engine starts meanwhile.
        t2 = time.perf_counter()
        warm_up_runner(self.logic.runner)
        # Where the start went (``stats()``; gpu_check prints it): the wait for the GPU, the
        # build in the turn, the warm-up after it, and the runner's own parts
        # (runners/start_phases.py).
        self.start_phases = dict(turn_wait_s=round(t1 - t0, 2), build_s=round(t2 - t1, 2),
                                 warm_up_s=round(time.perf_counter() - t2, 2),
                                 **getattr(self.logic.runner, "start_phases", {}))
        logging.getLogger("omni_ray").info("%s engine: start phases %s", stage, self.start_phases)
        gc_clock.install()  # each step record says how much of it was garbage collection
        gc_clock.freeze()  # what the start built is never walked again (stages/gc_clock.py)
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._reqs: dict[str, _ReqState] = {}
        self._aborted = Tombstones()  # aborts that came before their request
        self.timeline = Timeline()  # per-request milestones (omni_ray/timeline.py)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._loop_died = asyncio.Event()  # set (on the actor's loop) when _dead is
        self.counters = dict(steps=0, pushes_in=0, chunks_in=0, bytes_in=0, chunks_out=0,
                             chunks_down=0, aborts=0, errors=0, warmups=0, unclaimed=0)
        # with pipeline.coalesce_pushes, the chunks this engine's senders push: one call per
        # receiving engine and turn of the loop
        self._batcher = PushBatcher()
        # Where the loop thread's time goes (seconds; benchmarks diff them around a load level):
        # applying commands and chunks, stepping (the rest it waits); rows = requests stepped.
        self.loop_time = dict(commands_s=0.0, step_s=0.0, rows=0)
        self.trace = StepTrace()  # each of the last steps (stages/step_trace.py)
        self._profile = None  # (StepProfile, future) while a capture runs (step thread)
        self._profiling = False  # the same, seen from the actor's loop
        self.metrics = EngineMetrics(stage)

    # -- control plane (called by the Serve replica) ----------------------------------------
    async def ready(self) -> str:
        self._ensure_thread()
        return self.stage

    async def lifeline(self) -> str:
        """Returns only when the step loop has died (why, as text). The replica keeps one call
        pending (stages/supervisor.py): it fails the moment this actor's process dies."""
        await self._loop_died.wait()
        return repr(self._dead)

    async def add_request(self, request: OmniRequest, downstream=None) -> None:
        """Register a request; raises ValueError for invalid input (the caller maps it to 4xx).
        ``downstream``: the next stage's engine, None (no next stage), or ``DOWNSTREAM_LATER``
        (its chunks wait for ``attach``).

        When the stage's ``check`` can tell every refusal here (talker, code2wav), the add is
        queued for the step thread and this returns at once: a burst of opens does not wait
        for the step in progress (at 32 new requests, the talker's steps take hundreds of ms).
        Chunks and aborts for the request queue behind the add, so they find it."""
        self._ensure_thread()
        rid = request.request_id
        self._check_new(rid)
        queued = self.logic.check(request, downstream is not None)  # ValueError: nothing kept
        st = self._reqs[rid] = self._new_state(rid, downstream)
        self.timeline.start(rid)
        if rid.startswith(WARMUP_ID_PREFIX):
            self.counters["warmups"] += 1
        if queued:
            self._cmds.put(("add", (request, downstream is not None), None))
            self._expect_stream(rid, st)
            return
        try:
            await self._call(lambda: self.logic.add(request, downstream is not None))
        except BaseException:
            # Also when this call is cancelled (Serve cancels the replica's call and Ray its
            # child tasks, this one included): the add is queued on the loop thread and runs
            # anyway, so the runner's abort is queued behind it.
            self._drop(rid)
            self._post(lambda: self.logic.abort(rid))
            raise
        self._expect_stream(rid, st)

    def _new_state(self, rid: str, downstream) -> _ReqState:
        sender, later = None, None
        if downstream is not None:
            if downstream == DOWNSTREAM_LATER:
                later = self._loop.create_future()
            sender = ChunkSender(later or downstream, self.pipeline.max_chunks_in_flight,
                                 on_ack=self.metrics.on_chunk_acked,
                                 on_error=lambda e: self._on_push_error(rid, e),
                                 attach_timeout_s=UNCLAIMED_S,
                                 batcher=self._batcher if self.pipeline.coalesce_pushes else None)
        return _ReqState(rid, asyncio.Queue(), sender, downstream_later=later)

    async def attach(self, request_id: str, downstream) -> bool:
        """The next stage's engine for a request added with ``DOWNSTREAM_LATER``; its chunks
        go there from now on. False if the request is gone here (aborted, failed, finished)."""
        st = self._reqs.get(request_id)
        fut = st.downstream_later if st is not None else None
        if fut is None or fut.done():
            return False
        fut.set_result(downstream)
        return True

    def _expect_stream(self, rid: str, st: _ReqState) -> None:
        """Abort the request if no ``stream()`` claims it within ``UNCLAIMED_S``. The replica
        calls ``stream`` right after ``add_request``; when its call is cancelled in between,
        its own abort can be cancelled with it (a child task of the cancelled call)."""
        def reap() -> None:
            if self._reqs.get(rid) is st and not st.claimed:
                self.counters["unclaimed"] += 1
                self._loop.create_task(self.abort(rid))  # drops at once; subclasses' too

        self._loop.call_later(UNCLAIMED_S, reap)

    def _post(self, fn) -> None:
        """Queue ``fn`` on the loop thread without waiting (cleanup that must run even when
        the awaiting coroutine is cancelled)."""
        fut = self._loop.create_future()
        fut.add_done_callback(_retrieve)
        self._cmds.put(("call", fn, fut))

    def _check_new(self, rid: str) -> None:
        """Refuse a duplicate id, and a request whose abort arrived before it (tombstones.py)."""
        if rid in self._reqs:
            raise ValueError(f"duplicate request_id {rid!r}")
        if self._aborted.take(rid):
            raise StageRequestError(f"{self.stage}: request {rid!r} was aborted before it "
                                    "was added")

    async def stream(self, request_id: str):
        """Async generator of this request's encoded output items (see module docstring)."""
        st = self._reqs.get(request_id)
        if st is None:
            raise KeyError(f"unknown request {request_id!r}")
        st.claimed = True
        interval = self.pipeline.stream_interval_ms / 1000
        try:
            done, last = False, None
            while not done:
                items, batch = [await st.out.get()], []
                ends = items[0] is _END or isinstance(items[0], BaseException)
                if last is not None and not ends:  # the first list at once; an end found
                    # first (nothing else queued) too
                    wait = last + interval - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                while not st.out.empty():
                    items.append(st.out.get_nowait())
                for item in items:
                    if item is _END:
                        done = True
                        break
                    if isinstance(item, BaseException):
                        if batch:
                            yield batch
                        raise item
                    batch.append(item)
                if batch:
                    yield batch
                    last = time.monotonic()
            if st.sender is not None and not st.aborted:
                await st.sender.wait()  # every push acknowledged: no ref outlives the request
        finally:
            if not st.finished:
                await self.abort(request_id)
            self._drop(request_id)

    async def abort(self, request_id: str) -> bool:
        """End a request here; True if it was known. An abort of an unknown id is remembered,
        so that its ``add_request``, if still on its way, is refused."""
        st = self._reqs.get(request_id)
        if st is None:
            self._aborted.add(request_id)
            return False
        if st.abort_started:
            return False
        # On a disconnect both the stream's end and the replica's cancel call this, the second
        # while the first awaits the step thread: one request, one abort counted.
        st.abort_started = True
        self.counters["aborts"] += 1
        # Drop first and queue the runner's abort before awaiting it: an abort whose caller is
        # cancelled meanwhile (stream()'s cleanup) still leaves nothing behind.
        self._drop(request_id)
        await self._call(lambda: self.logic.abort(request_id))
        return True

    async def fail_next_step(self, request_id: str) -> None:
        """Fault injection for tests: the request fails at this stage's next step."""
        await self._call(lambda: self.logic.fail_next_step(request_id))

    async def stats(self) -> dict:
        import os

        import ray

        ctx = ray.get_runtime_context()
        return dict(
            stage=self.stage,
            actor_id=ctx.get_actor_id(), node_id=ctx.get_node_id(), pid=os.getpid(),
            requests=len(self._reqs),
            runner_requests=await self._call(self.logic.num_requests),
            loop_time=dict(self.loop_time),
            runner_time=self._runner_time(),
            senders_in_flight=sum(s.sender.in_flight for s in self._reqs.values() if s.sender),
            # the pushes out: calls made, chunks they carried, calls not yet answered
            push_calls_out=(self._batcher.calls if self.pipeline.coalesce_pushes
                            else self.counters["chunks_down"]),
            push_chunks_out=self.counters["chunks_down"],
            push_calls_in_flight=self._batcher.in_flight,
            held_chunks=sum(s.reorder.held for s in self._reqs.values()),
            start_phases=dict(self.start_phases),
            # the GPU share this process runs under, as its environment says (MPS reads it)
            mps={k: os.environ[k] for k in (SM_PERCENT_ENV, PRIORITY_ENV) if k in os.environ},
            **self.counters, **self.logic.counters(),
        )

    async def tune(self, fields: dict) -> dict:
        """Change ``LIVE_FIELDS`` of this engine's pipeline config for the requests that start
        from now on (``POST /debug/pipeline``): ValueError naming a field that cannot change or
        a bad value. Returns the live fields as they now are, with the stage and actor id."""
        import ray

        from omni_ray.config.pipeline import LIVE_FIELDS

        self.pipeline = self.pipeline.tuned(fields)
        self.logic.tune(self.pipeline)  # the thinker's text_chunk_ms, code2wav's urgent_ms
        return dict(stage=self.stage, actor_id=ray.get_runtime_context().get_actor_id(),
                    pipeline={k: getattr(self.pipeline, k) for k in LIVE_FIELDS})

    def _runner_time(self) -> dict:
        """The runner's ``time_spent`` counters and this process's garbage collection's."""
        return {**(getattr(self.logic.runner, "time_spent", None) or {}), **gc_clock.totals()}

    async def steps(self, since: float = 0.0, limit: int = 2000) -> dict:
        """This engine's steps that began at or after wall time ``since`` (the last ``limit``;
        stages/step_trace.py), with the actor id: a stage of several replicas answers once per
        engine."""
        import ray

        return dict(stage=self.stage, actor_id=ray.get_runtime_context().get_actor_id(),
                    steps=self.trace.since(since, limit))

    async def profile(self, steps: int = 50, timeout_s: float = 60.0,
                      stacks: bool = False) -> dict:
        """A ``torch.profiler`` summary of this engine's next ``steps`` steps
        (stages/step_profile.py); when fewer come in ``timeout_s`` (no traffic), of those.
        ``stacks``: with the Python call sites of the host's waits for the device.
        ValueError while another capture runs here."""
        from omni_ray.stages.step_profile import StepProfile

        prof = StepProfile(self.stage, steps, stacks)  # ValueError: steps < 1
        if self._profiling:
            raise ValueError(f"a profile of the {self.stage} engine is running")
        self._ensure_thread()
        self._profiling = True
        done = self._loop.create_future()
        try:
            await self._call(lambda: self._start_profile(prof, done))
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout_s)
            except asyncio.TimeoutError:
                pass
            self._post(lambda: self._end_profile(prof))  # a no-op when it ended by itself
            await done
            return await self._loop.run_in_executor(None, prof.summary)  # off the step thread
        except BaseException:  # cancelled or failed: the capture must not outlive the call
            self._post(lambda: self._end_profile(prof))
            raise
        finally:
            self._profiling = False

    def _start_profile(self, prof, done: asyncio.Future) -> None:
        prof.start()
        self._profile = (prof, done)

    def _end_profile(self, prof=None) -> None:
        """On the step thread: stop the running capture (only ``prof``, when given)."""
        if self._profile is None or (prof is not None and self._profile[0] is not prof):
            return
        prof, done = self._profile
        self._profile = None
        try:
            prof.stop()
        except Exception as e:  # the capture failed, not the engine
            self._loop.call_soon_threadsafe(_set_exc, done, e)
        else:
            self._loop.call_soon_threadsafe(_set_result, done, None)

    async def request_timeline(self, request_ids: list[str]) -> dict[str, dict[str, float]]:
        """Milestones of these requests here (omni_ray/timeline.py), for ``/debug/timeline``."""
        return self.timeline.get(request_ids)

    def _admitted(self):
        """The requests this engine holds, for the stage gauges (read from both threads)."""
        return self._reqs

    # -- data plane (called by the upstream engine) ------------------------------------------
    async def push(self, buf) -> bool:
        """Accept one encoded chunk; False if the request is unknown here (finished/aborted)."""
        self.counters["pushes_in"] += 1
        return self._accept(buf)

    async def push_many(self, bufs: list) -> list[bool]:
        """``push`` for several chunks in one call (the upstream's ``PushBatcher``: what its
        step sent here), in order; one answer per chunk."""
        self.counters["pushes_in"] += 1
        return [self._accept(buf) for buf in bufs]

    def _accept(self, buf) -> bool:
        chunk = decode_chunk(buf)
        self.counters["chunks_in"] += 1
        self.counters["bytes_in"] += int(getattr(buf, "nbytes", len(buf)))
        st = self._reqs.get(chunk.request_id)
        if st is None or st.finished:
            return False
        self.timeline.mark(chunk.request_id, "first_in")
        for c in st.reorder.add(chunk):
            self._cmds.put(("chunk", c, None))
        return True

    # -- the step loop -----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._run, name=f"{self.stage}-loop",
                                            daemon=True)
            self._thread.start()
        if self._dead is not None:
            raise RuntimeError(f"{self.stage} engine loop died: {self._dead!r}")

    async def _call(self, fn):
        """Run ``fn`` on the loop thread (the only thread touching the runner)."""
        fut = self._loop.create_future()
        self._cmds.put(("call", fn, fut))
        return await fut

    def _run(self) -> None:
        clock, spent, trace = time.perf_counter, self.loop_time, self.trace
        trace.baseline(self._runner_time())
        cmds, cmds_s = 0, 0.0  # applied since the last step
        try:
            while True:
                # 1) Apply commands; block only when there is nothing to step.
                block = not self.logic.has_work()
                if block:
                    self.metrics.on_idle(self._admitted())
                while True:
                    try:
                        kind, arg, fut = self._cmds.get(block=block, timeout=None)
                    except queue.Empty:
                        break
                    t0 = clock()
                    block = False
                    emits = self._apply(kind, arg, fut)
                    self._dispatch(emits)
                    took = clock() - t0
                    spent["commands_s"] += took
                    cmds, cmds_s = cmds + 1, cmds_s + took
                # 2) One step of the runner over every ready request.
                if self.logic.has_work():
                    t_wall, t0 = time.time(), clock()
                    emits = self.logic.step()
                    self.counters["steps"] += 1
                    self.metrics.on_step(self.logic.last_batch_size, self._admitted())
                    self._dispatch(emits)
                    took = clock() - t0
                    spent["step_s"] += took
                    spent["rows"] += self.logic.last_batch_size
                    trace.record(t_wall, took, self.logic.last_batch_size, len(emits), cmds,
                                 cmds_s, self._runner_time())
                    cmds, cmds_s = 0, 0.0
                    if self._profile is not None and self._profile[0].on_step():
                        self._end_profile()
        except BaseException as e:  # the loop itself broke: fail everything, loudly
            self._dead = e
            self._loop.call_soon_threadsafe(self._fail_all, e)

    def _apply(self, kind, arg, fut) -> list[Emit]:
        if kind == "add":  # checked already (add_request): a failure now is this request's
            req, has_downstream = arg
            try:
                self.logic.add(req, has_downstream)
            except Exception as e:
                self.logic.abort(req.request_id)
                return [Emit(req.request_id, "out", None, True, error=f"add failed: {_brief(e)}")]
            return []
        if kind == "call":
            try:
                result = arg()
            except BaseException as e:
                self._loop.call_soon_threadsafe(_set_exc, fut, e)
            else:
                self._loop.call_soon_threadsafe(_set_result, fut, result)
            return []
        return self.logic.on_chunk(arg)  # "chunk"

    def _dispatch(self, emits: list[Emit]) -> None:
        """Hand the step thread's emits to the actor's loop. Their milestones (``first_down``,
        ``first_out``) take this moment, inside the step that made them (its step record says
        which), not the later one the loop gets to them."""
        if emits:
            self._loop.call_soon_threadsafe(self._route, emits, time.time())

    # -- on the asyncio loop -----------------------------------------------------------------
    def _route(self, emits: list[Emit], t_made: float | None = None) -> None:
        for e in emits:
            st = self._reqs.get(e.request_id)
            if st is None:
                continue  # aborted meanwhile
            if e.error is not None:
                self.counters["errors"] += 1
                st.finished = True
                if st.sender is not None:
                    st.sender.cancel()
                st.out.put_nowait(StageRequestError(f"{self.stage}: {e.error}"))
                continue
            if e.target == "down":
                self.timeline.mark(e.request_id, "first_down", t_made)
                self.counters["chunks_down"] += 1
                st.sender.send(e.item)
                if e.final:
                    st.sender.close()
            else:
                if e.item is not None:
                    self.timeline.mark(e.request_id, "first_out", t_made)
                    self.counters["chunks_out"] += 1
                    st.out.put_nowait(encode_chunk(e.item))
                if e.final:
                    st.finished = True
                    st.out.put_nowait(_END)

    def _on_push_error(self, request_id: str, exc: BaseException) -> None:
        """A push to the next stage failed (e.g. its engine died): end this request with an
        error; ``stream`` then aborts it here. The step loop goes on for the others."""
        st = self._reqs.get(request_id)
        if st is None or st.finished:
            return
        self.counters["errors"] += 1
        st.out.put_nowait(StageRequestError(
            f"{self.stage}: push to {_NEXT_STAGE.get(self.stage, 'the next stage')} failed: "
            f"{_brief(exc)}"))

    def _drop(self, request_id: str) -> None:
        st = self._reqs.pop(request_id, None)
        if st is None:
            return
        self.timeline.finish(request_id)
        self.metrics.on_requests(self._admitted())
        if not st.finished:
            st.aborted = True
            st.finished = True
            st.out.put_nowait(_END)  # wakes a stream() still waiting on this request
        if st.sender is not None and not st.sender.done:
            st.sender.cancel()

    def _fail_all(self, exc: BaseException) -> None:
        self._loop_died.set()
        for st in self._reqs.values():
            st.finished = True
            st.out.put_nowait(StageRequestError(f"{self.stage} engine loop died: {exc!r}"))


def _log_to_stderr() -> None:
    """omni_ray's INFO lines (start turns and phases, kernel warm-up) into the actor's log:
    nothing configures the ``omni_ray`` logger in an engine process otherwise."""
    log = logging.getLogger("omni_ray")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _brief(exc: BaseException) -> str:
    """Type and first line of an error (Ray's actor errors run to many lines)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # mark retrieved: cleanup calls report nothing to anyone


def _set_result(fut, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut, exc) -> None:
    if not fut.done():
        fut.set_exception(exc)
