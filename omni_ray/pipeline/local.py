"""The local driver: the stage logics stepped in one process, their emits routed in-process.

``LocalPipeline`` owns the stage logics in pipeline order (thinker, then talker and code2wav when
audio is served). ``add`` registers a request with each stage it needs; ``step`` steps every stage
with work once, in order, and routes what it emits: ``down`` chunks through the in-process
transport (the wire codec, ``transport/local.py``) into the next stage's ``on_chunk``, ``out``
items into the request's ``LocalResult``. The Serve engine actor (stages/engine.py) steps the same
logics and routes the same emits through Ray instead.

A request that fails in a stage (an error ``Emit``) ends there and in every later stage; earlier
stages go on (a talker failure keeps the text, without audio). Other requests are untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from omni_ray.config.request import OmniRequest
from omni_ray.payload import AudioChunk, CodecChunk, FinishReason, TextDelta
from omni_ray.pipeline.emit import Emit, StageLogic
from omni_ray.transport.local import send_local


@dataclass
class LocalResult:
    """Everything one request produced, collected by the driver."""

    request: OmniRequest
    t0: float                                          # when it was added (clock seconds)
    live: set[int]                                     # indexes of the stages still holding it
    text_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.NONE    # the thinker's
    codes: list[Any] = field(default_factory=list)     # codec chunks' [n, groups] codes, in order
    audio: list[Any] = field(default_factory=list)     # every decoded piece (empty ones too)
    ttft: float | None = None                          # first thinker output, from t0
    ttfa: float | None = None                          # first non-empty audio piece, from t0
    error: str | None = None                           # "<stage>: <why>" of the first failure

    @property
    def done(self) -> bool:
        return not self.live


class LocalPipeline:
    """Steps ``logics`` (pipeline order) in-process; see the module docstring."""

    def __init__(self, logics: list[StageLogic], *,
                 transport: Callable[[Any], Any] = send_local,
                 clock: Callable[[], float] = time.perf_counter,
                 tap: Callable[[str, Emit], None] | None = None):
        """``transport`` carries ``down`` chunks (the wire codec by default); ``tap`` sees
        every emit routed, with its stage's name (tests, tracing)."""
        if not logics:
            raise ValueError("a pipeline needs at least one stage")
        self.logics = list(logics)
        self.transport = transport
        self.clock = clock
        self.tap = tap
        self.results: dict[str, LocalResult] = {}

    # -- requests ---------------------------------------------------------------------------
    def add(self, req: OmniRequest, t0: float | None = None) -> None:
        """Register ``req`` with every stage it needs (all of them for audio, else the first).
        On a stage's refusal the request is aborted wherever it got to, and the error raised."""
        rid = req.request_id
        if rid in self.results:
            raise ValueError(f"duplicate request_id {rid!r}")
        if req.wants_audio and len(self.logics) < 3:
            raise ValueError("this pipeline has no talker and code2wav stages: ask for "
                             "modalities=('text',)")
        n = 3 if req.wants_audio else 1
        try:
            for i in range(n):
                self.logics[i].add(req, i + 1 < n)
        except BaseException:
            self._abort_in(rid, range(n))
            raise
        self.results[rid] = LocalResult(req, self.clock() if t0 is None else t0, set(range(n)))

    def abort(self, request_id: str) -> None:
        """End ``request_id`` in every stage and forget it here (idempotent)."""
        self._abort_in(request_id, range(len(self.logics)))
        self.results.pop(request_id, None)

    def pop(self, request_id: str) -> LocalResult:
        """Take a request's result out of the driver (done or not)."""
        return self.results.pop(request_id)

    def all_done(self) -> bool:
        return all(r.done for r in self.results.values())

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> bool:
        """One step of every stage with work, in pipeline order; False if none had any."""
        progressed = False
        for i, logic in enumerate(self.logics):
            if logic.has_work():
                progressed = True
                self._route(i, logic.step())
        return progressed

    def run(self, requests: Iterable[OmniRequest]) -> list[LocalResult]:
        """Add ``requests`` together, step until every one is done, return their results in
        order. On any exception every one of them is aborted in every stage, then it is raised."""
        reqs = list(requests)
        t0 = self.clock()
        try:
            for r in reqs:
                self.add(r, t0)
            while not all(self.results[r.request_id].done for r in reqs):
                if not self.step():
                    raise RuntimeError("pipeline stalled: no stage can make progress")
        except BaseException:
            for r in reqs:
                self.abort(r.request_id)
            raise
        return [self.pop(r.request_id) for r in reqs]

    # -- routing ----------------------------------------------------------------------------
    def _route(self, i: int, emits: list[Emit]) -> None:
        for e in emits:
            res = self.results.get(e.request_id)
            if res is None:
                continue  # aborted meanwhile
            if self.tap is not None:
                self.tap(self.logics[i].stage, e)
            if e.error is not None:
                self._fail(res, i, e.error)
            elif e.target == "down":
                self._down(res, i, e)
            else:
                self._out(res, i, e)

    def _down(self, res: LocalResult, i: int, e: Emit) -> None:
        nxt = i + 1
        if nxt not in res.live:
            return  # the next stage already ended this request (e.g. max_audio_frames)
        chunk = self.transport(e.item)
        if isinstance(chunk, CodecChunk):
            res.codes.append(chunk.codes)
        self._route(nxt, self.logics[nxt].on_chunk(chunk))

    def _out(self, res: LocalResult, i: int, e: Emit) -> None:
        item = e.item
        if isinstance(item, TextDelta):
            if res.ttft is None:
                res.ttft = self.clock() - res.t0
            res.text_ids.extend(item.token_ids)
            if item.finished:
                res.finish_reason = item.finish_reason
        elif isinstance(item, AudioChunk):
            if item.samples.numel() and res.ttfa is None:
                res.ttfa = self.clock() - res.t0
            res.audio.append(item.samples)
        if e.final:
            res.live.discard(i)

    def _fail(self, res: LocalResult, i: int, error: str) -> None:
        """Stage ``i`` ended the request with ``error`` (it holds nothing of it any more)."""
        res.error = res.error or f"{self.logics[i].stage}: {error}"
        if i == 0:
            res.finish_reason = FinishReason.ERROR
        later = [j for j in res.live if j > i]
        self._abort_in(res.request.request_id, later)
        res.live -= {i, *later}

    def _abort_in(self, rid: str, stages: Iterable[int]) -> None:
        for j in stages:
            self.logics[j].abort(rid)
