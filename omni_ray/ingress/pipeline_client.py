"""Route one request through the stage deployments and merge their output streams.

The ingress owns the request's lifecycle: ``open`` opens every stage at once (each ``open``
returns its replica's engine handle), the thinker and the talker with ``DOWNSTREAM_LATER``, then
attaches each to the next stage's engine (their first chunks wait for it, the thinker's prefill
does not); it fails before any output when a stage rejects the request (the earliest stage in
code2wav, talker, thinker order names the error, as when they opened one after another); the
returned ``PipelineStream`` merges
the thinker's text and code2wav's audio into one stream. On any error, cancel or client
disconnect every stage call is cancelled, which aborts the request in each engine, and unless
every stage's stream ended the ingress also aborts it there itself (ingress/stage_aborts.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from omni_ray.config.request import DOWNSTREAM_LATER, OmniRequest
from omni_ray.exceptions import EngineUnavailable
from omni_ray.ingress.stage_aborts import StageReach, abort_stages
from omni_ray.payload import decode_chunk

_DONE = object()


class StageError(Exception):
    """A stage failed this request (the message names the stage)."""

    def __init__(self, stage: str, message: str):
        super().__init__(stage, message)  # every argument in ``args``: picklable across Ray
        self.stage, self.message = stage, message

    def __str__(self) -> str:
        return f"{self.stage}: {self.message}"


class StageUnavailable(Exception):
    """A stage cannot take the request now: its queue is full (Serve's ``BackPressureError``,
    ``code`` "overloaded"), it has no replica, or its engine is restarting (``EngineUnavailable``,
    ``code`` "engine_unavailable"). Answered with ``status_code`` (503 or 429) and
    ``Retry-After``."""

    def __init__(self, stage: str, message: str, status_code: int = 503,
                 retry_after_s: float | None = None, code: str = "overloaded"):
        super().__init__(stage, message, status_code, retry_after_s, code)
        self.stage, self.message = stage, message
        self.status_code, self.retry_after_s, self.code = status_code, retry_after_s, code

    def __str__(self) -> str:
        return f"{self.stage}: {self.message}"


class PipelineClient:
    def __init__(self, thinker, talker, code2wav, timeline=None):
        """``timeline``: the ingress's ``Timeline`` (omni_ray/timeline.py), for its
        ``thinker_sent`` mark; None: no marks."""
        self.thinker, self.talker, self.code2wav = thinker, talker, code2wav
        self.timeline = timeline
        # how abort_stages reaches an engine a request's call has not named
        self.reach = StageReach({"thinker": thinker, "talker": talker, "code2wav": code2wav})

    async def open(self, req: OmniRequest) -> "PipelineStream":
        """Open every stage the request needs. Raises ``ValueError`` (invalid input),
        ``StageUnavailable`` or ``StageError``; nothing stays open when it raises."""
        gens: list = []
        engines: dict = {}  # stage -> its engine (its call's first item), None: its call failed
        thinker = None
        try:
            if not req.wants_audio:
                await _into(self._open_thinker(req, None, gens), "thinker", engines)
                return PipelineStream(gens, req.request_id, engines, self.reach)
            later = req.without_media()  # the encoders' inputs go to the thinker only
            c2w = self.code2wav.options(stream=True).open.remote(later, None)
            gens.append(("code2wav", c2w))
            tk = self.talker.options(stream=True).open.remote(later, DOWNSTREAM_LATER)
            gens.append(("talker", tk))
            thinker = asyncio.ensure_future(self._open_thinker(req, DOWNSTREAM_LATER, gens))
            opened = await asyncio.gather(_into(_first(c2w, "code2wav"), "code2wav", engines),
                                          _into(_first(tk, "talker"), "talker", engines),
                                          _into(thinker, "thinker", engines),
                                          return_exceptions=True)
            for result in opened:  # the first failure in stage order, as opened one by one
                if isinstance(result, BaseException):
                    raise result
            c2w_engine, talker_engine, thinker_engine = opened
            attached = await asyncio.gather(
                talker_engine.attach.remote(req.request_id, c2w_engine),
                thinker_engine.attach.remote(req.request_id, talker_engine))
            if not all(attached):  # a stage dropped the request meanwhile (it failed there)
                raise StageError("talker" if not attached[0] else "thinker",
                                 "the request ended before its next stage was attached")
        except BaseException:
            if thinker is not None and not thinker.done():
                thinker.cancel()
            for _, g in gens:
                _cancel(g)
            abort_stages(req.request_id, gens, engines, self.reach)
            raise
        finally:
            self.reach.note(engines)
        return PipelineStream(gens, req.request_id, engines, self.reach)

    async def _open_thinker(self, req: OmniRequest, downstream, gens: list):
        """Open the thinker (appending its call to ``gens``); its engine handle. The
        disaggregated client (ingress/kv_client.py) replaces this with a prefill -> decode KV
        hand-off."""
        if self.timeline is not None:
            self.timeline.mark(req.request_id, "thinker_sent")
        th = self.thinker.options(stream=True).open.remote(req, downstream)
        gens.append(("thinker", th))
        return await _first(th, "thinker")

    async def run(self, req: OmniRequest) -> AsyncIterator[object]:
        """``open``, then the ``TextDelta`` and ``AudioChunk`` items as the stages make them."""
        async for item in await self.open(req):
            yield item


class PipelineStream:
    """One opened request: iterate once for its merged items; a stage failure raises
    ``StageError``. Leaving the iteration, ``close()`` or dropping it cancels every stage call."""

    def __init__(self, gens: list, request_id: str, engines: dict, reach: StageReach):
        self._gens = gens
        self._tasks: list[asyncio.Task] = []
        self._rid, self._engines, self._reach = request_id, engines, reach
        self._ended = False  # every stage's stream came to its end

    async def __aiter__(self) -> AsyncIterator[object]:
        queue: asyncio.Queue = asyncio.Queue()
        try:
            self._tasks = [asyncio.create_task(_pump(name, g, queue)) for name, g in self._gens]
            remaining = len(self._tasks)
            while remaining:
                name, item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise StageError(name, _first_line(item)) from item
                else:
                    yield item
            self._ended = True
        finally:
            self.close()

    def close(self) -> None:
        """Cancel every stage call (idempotent); unless every stage's stream ended, also abort
        the request in each stage's engine (``abort_stages``)."""
        for t in self._tasks:
            t.cancel()
        for _, g in self._gens:
            _cancel(g)
        if self._gens and not self._ended:
            abort_stages(self._rid, self._gens, self._engines, self._reach)
        self._tasks, self._gens = [], []

    def __del__(self):  # opened but never iterated (e.g. the client left before the body began)
        try:
            self.close()
        except Exception:
            pass


async def _into(first, name: str, engines: dict):
    """Await a stage call's first item (its engine), kept in ``engines`` as soon as it comes;
    None there when the call failed instead (a cancel leaves no entry: the call may be live)."""
    try:
        engines[name] = engine = await first
    except Exception:
        engines[name] = None
        raise
    return engine


def _cancel(gen) -> None:
    """Cancel a stage call. Serve's ``cancel()`` re-raises the call's error when its assignment
    already failed (e.g. ``BackPressureError``): then there is nothing left to cancel."""
    try:
        gen.cancel()
    except Exception:  # noqa: BLE001
        pass


async def _first(gen, name: str):
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        raise StageError(name, "stream ended before it started") from None
    except ValueError:
        raise
    except Exception as e:  # a replica's ValueError arrives wrapped: keep it a ValueError
        cause = _root(e)
        if isinstance(cause, ValueError):
            raise ValueError(str(cause)) from e
        if isinstance(cause, BackPressureError):
            raise StageUnavailable(name, f"overloaded, retry later ({cause.message})",
                                   cause.status_code, cause.retry_after_s) from e
        if isinstance(cause, DeploymentUnavailableError):
            raise StageUnavailable(name, cause.message) from e
        if isinstance(cause, EngineUnavailable):
            raise StageUnavailable(name, cause.reason, 503, cause.retry_after_s,
                                   code="engine_unavailable") from e
        raise StageError(name, _first_line(cause)) from e


def _first_line(e: BaseException, limit: int = 300) -> str:
    """What a client sees of an internal error: its first line (Ray's run to pages)."""
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:limit]


async def _pump(name: str, gen, queue: asyncio.Queue) -> None:
    try:
        async for bufs in gen:  # a list per item (StageEngine.stream)
            for buf in bufs:
                await queue.put((name, decode_chunk(buf)))
        await queue.put((name, _DONE))
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        await queue.put((name, _root(e)))


def _root(e: BaseException) -> BaseException:
    """Unwrap Ray's task errors to the exception the stage raised."""
    cause = getattr(e, "cause", None)
    while cause is not None and cause is not e:
        e, cause = cause, getattr(cause, "cause", None)
    return e
