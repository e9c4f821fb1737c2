"""Warm-up before ready: short requests through every stage before ``/health`` answers 200.

The first request through a fresh pipeline paid 15-30x the next one's time to first token (first
kernel runs, allocator growth, lazy imports, the audio processor's first call). So once every
stage reports ready, the ingress replica sends one short text+audio request, and one with an
audio input when the checkpoint has a processor, through the same path as a user request
(``RequestBuilder.chat`` -> ``PipelineClient.open`` -> ``Answers.events``). Their ids start with
``WARMUP_ID_PREFIX`` so every stage engine counts them (``warmups`` in ``/debug/stats``); they
stay out of the request metrics. A warm-up that fails is retried; ``/health`` says why meanwhile.
When a stage's engine restarts later (``/health`` sees its readiness say ``restarting``, or a
request is refused with ``engine_unavailable``), the warm-up runs again once every stage is back,
so a restarted engine is warm before ``/health`` is 200 again.

Standby engines (``engine_restart.standby``, stages/supervisor.py) are warmed the same way, in the
background and without touching ``/health``: once the warm-up is done, every ``STANDBY_POLL_S``
the stages' readiness is read, and while a stage reports a loaded standby that is not warm yet
the same requests go through the pipeline with ids ``STANDBY_WARMUP_ID_PREFIX`` (a stage routes
those to its standby, the others to their active engine), so a promoted standby is warm.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import struct
import time

from omni_ray.audio import pcm16_wav
from omni_ray.config.request import STANDBY_WARMUP_ID_PREFIX, WARMUP_ID_PREFIX
from omni_ray.config.serving import LimitsConfig
from omni_ray.ingress.api_models import ChatCompletionRequest
from omni_ray.ingress.errors import APIError

logger = logging.getLogger("ray.serve")

RETRY_S = 2.0  # between a failed warm-up and the next try
STANDBY_POLL_S = 1.0  # how often the stages are asked whether a standby needs its warm-up


class WarmUp:
    """One ingress replica's warm-up (a task): ``done`` and ``state`` for /health."""

    def __init__(self, ingress):
        self.ingress = ingress
        self.done = False
        self.state = "waiting for the stages"
        self.requests = 0  # warm-up requests finished (this run)
        self.runs = 0  # finished warm-ups (the first at start-up, then one per stage outage)
        self.seconds: float | None = None
        self.standby_runs = 0  # finished warm-ups of standby engines
        self.bodies: list[ChatCompletionRequest] = []  # the warm-up requests that passed
        self._task: asyncio.Task | None = None
        self._standby_task: asyncio.Task | None = None

    def start(self) -> None:
        """Run the warm-up unless one is under way (needs the replica's event loop)."""
        if self._task is None or self._task.done():
            self.done, self.state = False, "waiting for the stages"
            self._task = asyncio.get_running_loop().create_task(self.run(self.ingress))
        if self._standby_task is None and _any_standby(self.ingress.args):
            self._standby_task = asyncio.get_running_loop().create_task(self.standbys())

    def again(self) -> None:
        """A stage lost its engine: warm up again once every stage is back."""
        if self.done:
            self.start()

    async def run(self, ingress) -> None:
        t0 = time.monotonic()
        # 1) Wait until every stage has a ready engine.
        while True:
            states = await asyncio.gather(*(ingress._stage_readiness(n, h)
                                            for n, h in ingress.stage_handles.items()))
            if all(st["ready"] for st in states):
                break
            await asyncio.sleep(0.5)
        # 2) The warm-up requests, each to its end; retried until they pass.
        bodies = warmup_bodies(ingress.args.model_id, ingress.args.limits,
                               with_audio_input=ingress.media_ok())
        while True:
            self.state = "running"
            try:
                for body in bodies:
                    await _one(ingress, body)
                    self.requests += 1
                break
            except APIError as e:  # this deployment refuses the body itself: no retry helps
                logger.warning("warm-up request refused (%s); skipping it", e.message)
                bodies = [b for b in bodies if b is not body]
                self.requests = 0
            except Exception as e:  # noqa: BLE001 - say why on /health; try again
                self.state = f"failed ({type(e).__name__}: {str(e)[:200]}); retrying"
                logger.warning("warm-up %s", self.state)
                self.requests = 0
                await asyncio.sleep(RETRY_S)
        self.seconds = time.monotonic() - t0
        self.bodies = bodies  # (those this deployment accepts: the standby warm-up's too)
        self.state, self.done = "done", True
        self.runs += 1
        logger.info("warm-up: %d requests through every stage in %.1f s", len(bodies),
                    self.seconds)


    async def standbys(self) -> None:
        """Forever: warm the stages' loaded standbys that are not warm yet."""
        while True:
            await asyncio.sleep(STANDBY_POLL_S)
            if not self.done:
                continue
            ingress = self.ingress
            try:
                states = await asyncio.gather(*(ingress._stage_readiness(n, h)
                                                for n, h in ingress.stage_handles.items()))
                cold = [n for n, st in zip(ingress.stage_handles, states)
                        if st.get("standby_ready") and not st.get("standby_warm")]
                if not cold or not all(st["ready"] for st in states):
                    continue
                t0 = time.monotonic()
                for body in self.bodies:
                    await _one(ingress, body, STANDBY_WARMUP_ID_PREFIX)
                self.standby_runs += 1
                logger.info("warm-up of the standby engines of %s in %.1f s", cold,
                            time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001 - tried again at the next poll
                logger.warning("standby warm-up failed (%s: %s); retrying", type(e).__name__,
                               str(e)[:200])


def _any_standby(args, depth: int = 2) -> bool:
    """Whether any stage config in ``args`` (``thinker_disaggregation``'s too) keeps a standby."""
    from pydantic import BaseModel

    restart = getattr(args, "engine_restart", None)
    if restart is not None and restart.standby:
        return True
    return depth > 0 and any(
        _any_standby(v, depth - 1) for v in (getattr(args, n) for n in type(args).model_fields)
        if isinstance(v, BaseModel))


async def _one(ingress, body: ChatCompletionRequest, prefix: str = WARMUP_ID_PREFIX) -> None:
    req, _ = await ingress.requests.chat(body)
    req = req.model_copy(update={"request_id": prefix + req.request_id})
    stream = await ingress.client.open(req)
    async for _ in ingress.answers.events(req, stream, _NoTrack()):
        pass


class _NoTrack:
    """Stands in for a ``RequestTrack``: warm-up requests stay out of the request metrics."""

    def on_text(self) -> None: ...
    def on_audio(self) -> None: ...
    def finish(self, *_, **__) -> None: ...


def warmup_bodies(model_id: str, limits: LimitsConfig,
                  with_audio_input: bool) -> list[ChatCompletionRequest]:
    """Short text+audio requests: text input, then (if the processor exists and the limits let
    a half-second clip in) audio input."""
    base = {"model": model_id, "modalities": ["text", "audio"],
            "max_tokens": min(4, limits.max_tokens),
            "max_audio_frames": min(8, limits.max_audio_frames), "stream": True}
    bodies = [{**base, "messages": [{"role": "user", "content": "Hello"}]}]
    wav = _tone_wav()
    if with_audio_input and len(wav) * 3 // 4 <= limits.max_audio_bytes:
        part = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
        bodies.append({**base, "messages": [{"role": "user", "content": [
            part, {"type": "text", "text": "What is this?"}]}]})
    return [ChatCompletionRequest.model_validate(b) for b in bodies]


def _tone_wav(seconds: float = 0.5, rate: int = 16000) -> str:
    """Base64 of a quiet 440 Hz tone as 16-bit mono WAV."""
    n = int(seconds * rate)
    pcm = struct.pack(f"<{n}h", *(int(3000 * math.sin(2 * math.pi * 440 * i / rate))
                                  for i in range(n)))
    return base64.b64encode(pcm16_wav(pcm, rate)).decode()
