"""The OpenAI-compatible ingress deployment (FastAPI).

Routes: ``POST /v1/chat/completions`` (text and/or audio out, streaming or not),
``WS /v1/realtime`` (OpenAI's Realtime protocol), ``POST /v1/audio/transcriptions``,
``GET /v1/audio/voices``, ``GET /v1/models``, ``GET /health``, ``GET /debug/stats``,
``/debug/timeline``, ``/debug/steps``, ``/debug/profile``, ``POST /debug/pipeline`` and
``POST /debug/engines`` (off unless enabled). Python callers use ``generate`` and ``speak``
(streams: ``handle.options(stream=True)``) and ``transcribe`` through a ``DeploymentHandle``.

Each route here checks the caller, opens the request's stages and owns its lifecycle; a body
becomes an ``OmniRequest`` in ``chat_request.py`` and an opened stream its answer (events, a
``chat.completion`` or SSE chunks) in ``chat_answer.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import AsyncIterator

from fastapi import Body, FastAPI, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import OmniServingArgs
from omni_ray.ingress import speech, transcribe
from omni_ray.ingress.api_models import ChatCompletionRequest
from omni_ray.ingress.audio_store import TranscriptStore
from omni_ray.ingress.chat_answer import Answers
from omni_ray.ingress.chat_request import RequestBuilder, validate
from omni_ray.inputs.processor import InputProcessor
from omni_ray.ingress.errors import (
    APIError,
    api_error_handler,
    bad_request,
    http_error_handler,
    unhandled_error_handler,
    validation_error_handler,
)
from omni_ray.ingress.guard import Guard, GuardMiddleware, resolve_api_keys
from omni_ray.ingress.realtime.endpoint import RealtimeEndpoint
from omni_ray.ingress.warmup import WarmUp
from omni_ray.models.speakers import checkpoint_speakers, resolve_speaker
from omni_ray.ingress.pipeline_client import (
    PipelineClient,
    PipelineStream,
    StageError,
    StageUnavailable,
)
from omni_ray.ingress.sse_response import SSEResponse
from omni_ray.metrics import IngressMetrics, RequestStatus, RequestTrack
from omni_ray.testing import faults
from omni_ray.timeline import Timeline
from omni_ray.ingress.speech import SpeechRequest

logger = logging.getLogger("ray.serve")

app = FastAPI(title="omni_ray", version="0.1.0",
              description="OpenAI-compatible omni model serving on Ray Serve")
app.add_exception_handler(APIError, api_error_handler)
app.add_exception_handler(RequestValidationError, validation_error_handler)
app.add_exception_handler(StarletteHTTPException, http_error_handler)
app.add_exception_handler(Exception, unhandled_error_handler)

# API keys, body limit, per-key concurrency (omni_ray/ingress/guard.py, open paths listed there).
# Serve serves a pickled copy of ``app``; ``__serve_build_asgi_app__`` puts the guard on that copy.
app.add_middleware(GuardMiddleware)

RETRY_AFTER_S = 1  # Retry-After when a stage's backpressure_config sets none
# A stage that does not answer /health's readiness call in this is not ready (while its replica
# starts, Serve holds the call until it runs: /health must not wait for that).
HEALTH_TIMEOUT_S = 2.0
# POST /debug/pipeline and /debug/engines ask each stage until this many calls in a row reach no
# new engine or replica (Serve routes a call to one replica: two replicas are all reached with
# p > 0.9999), or this many.
TUNE_QUIET_CALLS, TUNE_MAX_ENGINES = 12, 64
TIMELINE_CALLS = 16  # asks of one stage for its marks, at most (2 replicas: one missed 2^-16)


async def _every_replica(call, key: str) -> dict[str, dict]:
    """Reach every replica of a stage with ``call()`` (one Serve call, which Serve routes to one
    replica): call until ``TUNE_QUIET_CALLS`` answers in a row name no new ``key`` (an engine's
    or replica's id), or ``TUNE_MAX_ENGINES`` are known; each one's first answer by its id."""
    answers: dict[str, dict] = {}
    quiet = 0
    while quiet < TUNE_QUIET_CALLS and len(answers) < TUNE_MAX_ENGINES:
        got = await call()
        quiet = 0 if got[key] not in answers else quiet + 1
        answers.setdefault(got[key], got)
    return answers


async def _every_replicas_marks(handle, ids: list[str]) -> dict[str, dict[str, float]]:
    """A stage's marks of these requests from all its replicas: Serve routes each call to one
    replica (the least busy, so a level's idle replica oftener than not), so ask until every
    request was found or ``TIMELINE_CALLS`` calls were made (a text-only request never reaches
    code2wav)."""
    merged: dict[str, dict[str, float]] = {}
    for _ in range(TIMELINE_CALLS):
        for rid, marks in (await handle.request_timeline.remote(ids)).items():
            merged.setdefault(rid, {}).update(marks)
        if len(merged) == len(set(ids)):
            break
    return merged


class OmniIngress:
    """Undecorated; ``build_omni_app`` applies ``serve.ingress(app)`` and ``serve.deployment``."""

    def __init__(self, thinker, talker, code2wav, args: OmniServingArgs | dict,
                 thinker_prefill=None):
        """``thinker_prefill``: the ThinkerPrefill deployment when the thinker is disaggregated
        (``thinker`` is then ThinkerDecode; see ingress/kv_client.py)."""
        from omni_ray.models.dummy import dummy_info
        from omni_ray.models.tokenizer import load_tokenizer

        self.args = OmniServingArgs.model_validate(args)
        model_dir = self.args.checkpoint_dir()
        self.dummy = dummy_info(model_dir)  # the stand-in's marker (random weights), or None
        self.tokenizer = load_tokenizer(model_dir)
        self.inputs = InputProcessor(model_dir, self.tokenizer)
        self.speakers = checkpoint_speakers(model_dir)
        self.transcripts = TranscriptStore()  # audio.id -> transcript (multi-turn)
        self.timeline = Timeline()  # per-request milestones here; /debug/timeline joins stages'
        # a body -> its OmniRequest (ingress/chat_request.py); an opened stream -> the answer
        # (ingress/chat_answer.py)
        self.requests = RequestBuilder(self.args, self.tokenizer, self.inputs, self.speakers,
                                       self.transcripts)
        self.answers = Answers(model_dir, self.args.model_id, self.tokenizer, self.timeline,
                               self.transcripts)
        self.client = PipelineClient(thinker, talker, code2wav, self.timeline)
        self.stage_handles = dict(thinker=thinker, talker=talker, code2wav=code2wav)
        if self.args.disaggregated:
            from omni_ray.ingress.kv_client import DisaggPipelineClient

            self.client = DisaggPipelineClient(thinker_prefill, thinker, talker, code2wav,
                                               self.args.thinker_disaggregation, self.timeline)
            self.stage_handles["thinker_prefill"] = thinker_prefill
        lim = self.args.limits
        self.guard = Guard(resolve_api_keys(self.args.security, os.environ), lim.max_body_bytes,
                           lim.max_concurrent_requests_per_key)
        self.metrics = IngressMetrics()
        self.created = int(time.time())
        self.realtime = RealtimeEndpoint(self)  # WS /v1/realtime (omni_ray/ingress/realtime/)
        # Short requests through every stage once they are ready; /health is 200 only after.
        self.warm_up = WarmUp(self)
        self.warm_up.start()

    def __serve_build_asgi_app__(self):
        """Serve calls this after ``__init__``: put this replica's guard on the served app."""
        self.app.state.guard = self.guard
        return self.app

    # -- routes --------------------------------------------------------------------------------
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health(self):
        """200 once every stage has a replica whose engine can serve and this replica's warm-up
        (ingress/warmup.py) is done; before that (engines loading, one after another on a shared
        GPU; warming up) and while a stage's engine is down, 503 naming the stages not ready."""
        states = await asyncio.gather(*(self._stage_readiness(name, h)
                                         for name, h in self.stage_handles.items()))
        waiting = {name: st["reason"] for name, st in zip(self.stage_handles, states)
                   if not st["ready"]}
        if not waiting and self.warm_up.done:
            return {"status": "ok"}
        if any(st.get("restarting") for st in states):
            self.warm_up.again()  # a stage lost its engine: warm its new one before 200
        status = "unavailable" if waiting else "warming_up"
        return JSONResponse({"status": status, "stages_not_ready": waiting,
                             "warm_up": self.warm_up.state},
                            status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    @staticmethod
    async def _stage_readiness(name: str, handle) -> dict:
        """The stage's ``readiness`` answer: ``ready``, ``reason`` (and ``restarting``)."""
        try:
            return await asyncio.wait_for(handle.readiness.remote(), timeout=HEALTH_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - no replica answering is "not ready"
            return {"ready": False, "reason": f"no replica answered ({type(e).__name__})"}

    @app.get("/v1/models")
    async def models(self) -> dict:
        entry = {"id": self.args.model_id, "object": "model", "created": self.created,
                 "owned_by": "omni_ray"}
        if self.dummy is not None:  # random weights: say so
            entry["omni_ray"] = {"dummy_weights": True, "shape": self.dummy.get("shape"),
                                 "seed": self.dummy.get("seed")}
        return {"object": "list", "data": [entry]}

    @app.get("/v1/audio/voices")
    async def voices(self) -> dict:
        """The checkpoint's speakers, as vLLM-Omni answers this route (``voices``: names;
        ``uploaded_voices``: none, this server takes no uploads), plus the default voice."""
        return {"voices": list(self.speakers), "uploaded_voices": [],
                "default": resolve_speaker(self.args.default_speaker, self.speakers)}

    @app.post("/v1/audio/speech")
    async def speech(self, body: SpeechRequest):
        """OpenAI's text to speech: the talker voices ``input`` exactly (ingress/speech.py)."""
        track = self.metrics.track(["audio"])
        try:
            req = await self.requests.speech(body)
        except APIError:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise
        self.timeline.start(req.request_id, "received")
        stream = await self._open(req, None, track)

        def fail(e: BaseException) -> APIError:
            logger.warning("request %s failed: %s", req.request_id, type(e).__name__)
            return APIError(500, f"request {req.request_id} failed: {e}", type="server_error")

        return await speech.response(body, self.answers.events(req, stream, track), fail)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(self, request: Request):
        """OpenAI's transcription request (multipart): the thinker answers a chat request of the
        audio and a transcription instruction, text out (omni_ray/ingress/transcribe.py)."""
        form = await transcribe.read_form(request, self.args.limits)
        body = transcribe.chat_body(form, self.args.limits)
        track = self.metrics.track(["text"])
        try:
            req, _ = await self.requests.chat(ChatCompletionRequest.model_validate(body))
        except APIError as e:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise transcribe.as_file_error(e) from None
        self.timeline.start(req.request_id, "received")
        stream = await self._open(req, None, track)
        answer = await self.answers.complete(req, stream, "wav", track)
        return transcribe.response(form, answer)

    @app.websocket("/v1/realtime")
    async def realtime_socket(self, websocket: WebSocket):
        """OpenAI's Realtime protocol: speech in, speech out, server VAD, barge-in."""
        await self.realtime.serve(websocket)

    def _debug_on(self) -> None:
        """404 unless ``security.enable_debug_endpoints`` (every ``/debug`` route)."""
        if not self.args.security.enable_debug_endpoints:
            raise APIError(404, "debug endpoints are off (security.enable_debug_endpoints)",
                           type="not_found_error")

    def _debug_stage(self, stage: str):
        """A ``/debug`` route's stage handle: 404 when they are off, 400 naming ``stage``."""
        self._debug_on()
        handle = self.stage_handles.get(stage)
        if handle is None:
            raise bad_request(f"stage must be one of {sorted(self.stage_handles)}", "stage")
        return handle

    @app.get("/debug/realtime")
    async def debug_realtime(self) -> dict:
        """This replica's open realtime sockets, responses running and conversation items."""
        self._debug_on()
        return self.realtime.stats()

    @app.get("/debug/stats")
    async def debug_stats(self) -> dict:
        self._debug_on()
        out = {}
        for name, h in self.stage_handles.items():
            out[name] = await h.stats.remote()
        if self.args.disaggregated:
            out["kv_ingress"] = self.client.stats()  # this replica's KV hand-offs
        return out

    @app.get("/debug/timeline")
    async def debug_timeline(self, limit: int = Query(64, ge=1, le=1024)) -> dict:
        """The last ``limit`` finished requests of this replica, each with the milestones every
        stage noted (wall-clock seconds; omni_ray/timeline.py): where the first audio went."""
        self._debug_on()
        ids = self.timeline.recent(limit)
        stages = await asyncio.gather(*(_every_replicas_marks(h, ids)
                                        for h in self.stage_handles.values()))
        out = {rid: {"ingress": m} for rid, m in self.timeline.get(ids).items()}
        for name, marks in zip(self.stage_handles, stages):
            for rid, m in marks.items():
                out.setdefault(rid, {})[name] = m
        return {"requests": [dict(request_id=rid, **out[rid]) for rid in ids if rid in out]}

    @app.get("/debug/steps")
    async def debug_steps(self, stage: str = Query(...), since: float = Query(0.0, ge=0),
                          limit: int = Query(2000, ge=1, le=8192)) -> dict:
        """``stage``'s steps (one replica's engine, with its ``actor_id``) that began at or after
        wall time ``since``, the last ``limit``: each one's start, length, rows and the runner's
        parts (stages/step_trace.py), to find the slow steps a mean hides."""
        handle = self._debug_stage(stage)
        return await handle.steps.remote(since, limit)

    @app.post("/debug/pipeline")
    async def debug_pipeline(self, fields: dict = Body(...)) -> dict:
        """Change the pipeline's live fields (``config/pipeline.LIVE_FIELDS``) on every stage
        engine of the running app, for the requests that start after: an A/B on the same engines
        without a restart (benchmarks/gpu_check.py). 400 naming a field that cannot change or a
        bad value. Each stage is asked until no new engine answers (Serve routes each call to one
        replica): the answer lists every engine reached with its live fields."""
        self._debug_on()
        from pydantic import ValidationError

        try:
            self.args.pipeline.tuned(fields)  # checked here first: no engine half-changed
        except ValidationError as e:
            err = e.errors()[0]
            raise bad_request(f"{err['msg']}", ".".join(map(str, err["loc"]))) from None
        except ValueError as e:
            raise bad_request(str(e), str(e).split()[0].removeprefix("pipeline.")) from None
        out = {}
        for name, handle in self.stage_handles.items():
            engines = await _every_replica(lambda h=handle: h.tune.remote(fields), "actor_id")
            out[name] = {engine: got["pipeline"] for engine, got in engines.items()}
        return out

    @app.post("/debug/engines")
    async def debug_engines(self, changes: dict[str, dict] = Body(...)) -> dict:
        """Replace stages' engines to run under other MPS settings (``{stage: {"mps_sm_percent":
        70, "mps_low_priority": true}}``, ``engine_resources``' fields): an A/B of a stage's
        share of the GPU on the running app, the other stages' engines kept
        (benchmarks/gpu_check.py). 400 naming a stage, field or value; all checked before any
        engine changes. Stages go one after another (one load on a GPU at a time), each asked
        until no new replica answers; a replica already under the settings keeps its engine.
        The answer: per stage, per replica, whether its engine was replaced, in how many
        seconds, and the MPS environment it runs under now."""
        self._debug_on()
        from pydantic import ValidationError

        from omni_ray.config.serving import EngineResources

        for stage, mps in changes.items():
            self._debug_stage(stage)
            try:
                EngineResources().with_mps(mps)
            except ValidationError as e:
                err = e.errors()[0]
                raise bad_request(err["msg"], f"{stage}.{'.'.join(map(str, err['loc']))}") \
                    from None
            except ValueError as e:
                raise bad_request(str(e), f"{stage}.{str(e).split(':')[0]}") from None
        out = {}
        for stage, mps in changes.items():
            handle = self.stage_handles[stage]
            out[stage] = await _every_replica(lambda h=handle, m=mps: h.renew_engine.remote(m),
                                              "replica")
        return out

    @app.get("/debug/profile")
    async def debug_profile(self, stage: str = Query(...), steps: int = Query(50, ge=1, le=2000),
                            timeout_s: float = Query(60.0, gt=0, le=600),
                            stacks: bool = Query(False)) -> dict:
        """A ``torch.profiler`` summary of ``stage``'s engine over its next ``steps`` steps
        under the traffic running now (stages/step_profile.py): ops by host and device time,
        and the host's waits for the device (``stacks``: with their Python call sites)."""
        handle = self._debug_stage(stage)
        try:
            return await handle.profile.remote(steps, timeout_s, stacks)
        except ValueError as e:  # another capture is running there
            raise APIError(409, str(e).strip().splitlines()[-1], param="stage",
                           code="profile_running") from None

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        received = time.time()
        fault, kv_fault = faults.requested(request.headers, self.args.security.allow_fault_injection)
        track = self.metrics.track(body.modalities)
        try:
            req, audio_format = await self.requests.chat(body)
        except APIError:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise
        self.timeline.start(req.request_id, "received", received)
        self.timeline.mark(req.request_id, "parsed")
        logger.info("request %s: modalities=%s stream=%s", req.request_id, req.modalities,
                    body.stream)
        # Open the stages before answering: a full stage is a 503 + Retry-After, not a stream error.
        stream = await self._open(req, fault, track, kv_fault)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return SSEResponse(self.answers.sse(req, stream, include_usage, track))
        return JSONResponse(await self.answers.complete(req, stream, audio_format, track))

    # -- browser playground (omni_ray/ingress/playground.py; open paths in Guard) ---------------
    @app.get("/", include_in_schema=False)
    async def index(self):
        from omni_ray.ingress import playground

        return playground.page_response()

    @app.get("/playground", include_in_schema=False)
    async def playground_page(self):
        from omni_ray.ingress import playground

        return playground.page_response()

    @app.get("/static/{name}", include_in_schema=False)
    async def playground_static(self, name: str):
        from omni_ray.ingress import playground

        return playground.static_response(name)

    # -- Python API (DeploymentHandle) -----------------------------------------------------------
    async def generate(self, body: dict) -> AsyncIterator[dict]:
        """Stream events (plain dicts) for an OpenAI-style body; every value is a Python
        builtin or a numpy array, so a caller needs neither torch nor omni_ray's payload types:

        * ``{"type": "text", "delta": str}``
        * ``{"type": "audio", "seq": int, "start_sample": int, "num_samples": int,
          "pcm16": bytes (little-endian int16, 24 kHz mono), "samples": numpy float32 [n]}``
        * ``{"type": "done", "finish_reason": "stop"|"length", "usage": {...}, "text": str}``

        Invalid bodies raise ``ValueError``; a full or missing stage raises
        ``StageUnavailable``, a failed one ``StageError``.
        """
        track = self.metrics.track(body.get("modalities") if isinstance(body, dict) else None)
        try:
            parsed = validate(ChatCompletionRequest, body)
            req, _ = await self.requests.chat(parsed)
        except APIError as e:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise ValueError(e.message) from None
        stream = await self._open_for_handle(req, track)
        async for ev in self.answers.events(req, stream, track):
            yield ev

    async def speak(self, body: dict) -> AsyncIterator[dict]:
        """Text to speech for a ``/v1/audio/speech`` body (``model``, ``input``, ``voice``,
        ``max_audio_frames``; the answer is always raw audio, so ``response_format`` and
        ``stream_format`` are ignored): ``audio`` events as ``generate``'s, then ``done``
        (``text``: the input as spoken, ``usage``). Errors as ``generate``'s."""
        track = self.metrics.track(["audio"])
        try:
            req = await self.requests.speech(validate(SpeechRequest, body))
        except APIError as e:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise ValueError(e.message) from None
        stream = await self._open_for_handle(req, track)
        async for ev in self.answers.events(req, stream, track):
            if ev["type"] != "text":  # the given text itself: the done event carries it
                yield ev

    async def transcribe(self, body: dict) -> dict:
        """A transcription (``/v1/audio/transcriptions``' fields as a dict, ``file`` the audio
        file's bytes, wav or mp3): ``{"text": str, "usage": {...}}`` as the route's ``json``
        answer. Errors as ``generate``'s."""
        track = self.metrics.track(["text"])
        try:
            form = transcribe.form_from_body(body, self.args.limits)
            chat = ChatCompletionRequest.model_validate(
                transcribe.chat_body(form, self.args.limits))
            req, _ = await self.requests.chat(chat)
        except APIError as e:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise ValueError(transcribe.as_file_error(e).message) from None
        stream = await self._open_for_handle(req, track)
        done = None
        async for ev in self.answers.events(req, stream, track):
            done = ev if ev["type"] == "done" else done
        return {"text": done["text"], "usage": transcribe.usage(done["usage"])}

    async def _open_for_handle(self, req: OmniRequest, track: RequestTrack) -> PipelineStream:
        """Open the request's stages for a handle caller: refusals raise as they are."""
        try:
            return await self.client.open(req)
        except StageUnavailable as e:
            track.finish(RequestStatus.REJECTED, e.code)
            raise
        except StageError as e:
            track.finish(RequestStatus.ERROR, e.stage)
            raise
        except ValueError:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise

    # -- internals -------------------------------------------------------------------------------
    def media_ok(self) -> bool:
        """Whether this deployment takes audio / image input."""
        return self.requests.media_unsupported() is None

    async def _open(self, req: OmniRequest, fault: str | None,
                    track: RequestTrack, kv_fault: str | None = None) -> PipelineStream:
        """Open the request's stages; refusals become OpenAI errors (503/429 + Retry-After)."""
        opts = {}
        if kv_fault:  # tests only: x-omni-kv-fault (ingress/kv_client.py)
            from omni_ray.ingress.kv_client import kv_fault_from_header

            try:
                opts["kv_fault"] = kv_fault_from_header(kv_fault, self.client)
            except ValueError as e:
                track.finish(RequestStatus.INVALID, "invalid_request")
                raise bad_request(str(e), "x-omni-kv-fault") from e
        if fault:
            await self._inject(req, fault)
        self.timeline.mark(req.request_id, "opening")
        try:
            stream = await self.client.open(req, **opts)
            self.timeline.mark(req.request_id, "opened")
            return stream
        except StageUnavailable as e:
            track.finish(RequestStatus.REJECTED, e.code)
            if e.code == "engine_unavailable":
                self.warm_up.again()
            retry = math.ceil(e.retry_after_s if e.retry_after_s is not None else RETRY_AFTER_S)
            what = "server overloaded" if e.code == "overloaded" else "service unavailable"
            raise APIError(e.status_code, f"{what}, retry later: {e}",
                           type="rate_limit_error" if e.status_code == 429 else "server_error",
                           code=e.code, headers={"Retry-After": str(retry)}) from e
        except ValueError as e:  # a stage refused the request itself
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise bad_request(str(e)) from e
        except StageError as e:
            track.finish(RequestStatus.ERROR, e.stage)
            raise APIError(500, f"request {req.request_id} failed: {e}", type="server_error") from e

    async def _inject(self, req: OmniRequest, stage: str) -> None:
        """Tests only: make ``stage`` fail this request (``x-omni-fault`` header)."""
        import asyncio

        handle = self.stage_handles.get(stage)
        if handle is None:
            raise bad_request(f"x-omni-fault: unknown stage {stage!r}", "x-omni-fault")

        async def later():
            await asyncio.sleep(0.3)
            await handle.fail_next_step.remote(req.request_id)

        asyncio.get_running_loop().create_task(later())
