"""An opened request's stream as the answer its caller asked for.

``events``: plain dicts (text deltas, audio pieces, done with the usage), what the handle
methods, the realtime sessions and the warm-up read; ``complete``: one ``chat.completion``;
``sse``: ``chat.completion.chunk`` events. Each finishes the request's metrics track and closes
its stream however it ends, and keeps a spoken answer's transcript for a later turn that names
its ``audio.id``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator

from omni_ray.audio_formats import encode_audio
from omni_ray.config.request import OmniRequest
from omni_ray.ingress.audio_store import TranscriptStore
from omni_ray.ingress.detok import Detokenizer
from omni_ray.ingress.errors import APIError
from omni_ray.ingress.pipeline_client import PipelineStream, StageError
from omni_ray.metrics import RequestStatus, RequestTrack
from omni_ray.payload import AudioChunk, FinishReason, TextDelta
from omni_ray.timeline import Timeline

logger = logging.getLogger("ray.serve")

# One audio token = one codec frame of the talker = 80 ms of 24 kHz audio (code2wav upsamples a
# frame to 1920 samples); usage counts the answer's frames from its length (docs/api.md).
AUDIO_TOKEN_SAMPLES = 1920


class Answers:
    """Renders a replica's answers: its tokenizer (streamed text), timeline (first text and
    audio), transcripts, model id and the checkpoint's media placeholder ids (usage)."""

    def __init__(self, model_dir, model_id: str, tokenizer, timeline: Timeline,
                 transcripts: TranscriptStore):
        self.model_id, self.tokenizer = model_id, tokenizer
        self.timeline, self.transcripts = timeline, transcripts
        self.media_token_ids = media_token_ids(model_dir)  # usage's prompt_tokens_details

    async def events(self, req: OmniRequest, stream: PipelineStream,
                     track: RequestTrack) -> AsyncIterator[dict]:
        """The opened request's stream as plain events (``OmniIngress.generate`` says their
        keys): text deltas, audio pieces, then done; the request's metrics ``track`` finished
        and its stream closed however it ends."""
        detok = Detokenizer(self.tokenizer)
        n_out, n_samples, reason = 0, 0, FinishReason.NONE
        try:
            async for item in stream:
                if isinstance(item, TextDelta):
                    n_out += len(item.token_ids)
                    text = detok.add(item.token_ids, item.finished)
                    if text:
                        track.on_text()
                        self.timeline.mark(req.request_id, "first_text")
                        yield {"type": "text", "delta": text}
                    if item.finished:
                        reason = item.finish_reason
                elif isinstance(item, AudioChunk):
                    from omni_ray.audio import to_float32, to_pcm16

                    samples = to_float32(item.samples)  # plain numpy: see generate()
                    n_samples += samples.size
                    if samples.size:
                        track.on_audio()
                        self.timeline.mark(req.request_id, "first_audio")
                    yield {"type": "audio", "seq": int(item.seq),
                           "start_sample": int(item.start_sample),
                           "num_samples": int(samples.size), "pcm16": to_pcm16(samples),
                           "samples": samples}
        except StageError as e:
            track.finish(RequestStatus.ERROR, e.stage)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            track.finish(RequestStatus.ABORTED, "client_disconnect")
            raise
        except BaseException:
            track.finish(RequestStatus.ERROR, "internal")
            raise
        finally:
            stream.close()
            self.timeline.finish(req.request_id)
        track.finish(RequestStatus.OK)
        usage = self.usage(req.prompt_token_ids, n_out, n_samples)
        yield {"type": "done", "finish_reason": finish_reason(reason), "usage": usage,
               "text": detok.text}

    def usage(self, prompt_ids: list[int], text_tokens: int, audio_samples: int) -> dict:
        """OpenAI's ``usage``: completion tokens are the thinker's text tokens plus the audio
        tokens (codec frames, 80 ms each, counted from the waveform); prompt audio/image tokens
        are the encoders' placeholder tokens in the prompt (docs/api.md)."""
        audio_in = sum(1 for t in prompt_ids if t == self.media_token_ids["audio"])
        image_in = sum(1 for t in prompt_ids if t in self.media_token_ids["image"])
        audio_out = -(-audio_samples // AUDIO_TOKEN_SAMPLES)
        completion = text_tokens + audio_out
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                "total_tokens": len(prompt_ids) + completion,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": audio_in,
                                          "image_tokens": image_in,
                                          "text_tokens": len(prompt_ids) - audio_in - image_in},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": audio_out,
                                              "text_tokens": text_tokens,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0}}

    async def complete(self, req: OmniRequest, stream: PipelineStream, audio_format: str,
                       track: RequestTrack) -> dict:
        """The whole answer as one ``chat.completion`` (audio encoded in ``audio_format``)."""
        import numpy as np

        text, pieces, done = "", [], None
        try:
            async for ev in self.events(req, stream, track):
                if ev["type"] == "text":
                    text += ev["delta"]
                elif ev["type"] == "audio":
                    pieces.append(ev["samples"])
                else:
                    done = ev
        except StageError as e:
            raise APIError(500, f"request {req.request_id} failed: {e}", type="server_error") from e
        message: dict = {"role": "assistant", "content": text if "text" in req.modalities else None}
        if req.wants_audio:
            samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
            data = await asyncio.to_thread(encode_audio, samples, audio_format)
            audio_id = f"audio_{req.request_id[9:]}"
            message["audio"] = {"id": audio_id, "data": base64.b64encode(data).decode(),
                                "expires_at": self.transcripts.put(audio_id, done["text"]),
                                "transcript": done["text"]}
        return {"id": req.request_id, "object": "chat.completion", "created": int(time.time()),
                "model": self.model_id,
                "choices": [{"index": 0, "message": message, "finish_reason": done["finish_reason"]}],
                "usage": done["usage"]}

    async def sse(self, req: OmniRequest, stream: PipelineStream, include_usage: bool,
                  track: RequestTrack) -> AsyncIterator[str]:
        """The answer as ``chat.completion.chunk`` server-sent events, then ``[DONE]``: a
        stream once started always ends with an error event or the finish, and ``[DONE]``."""
        created = int(time.time())
        base = {"id": req.request_id, "object": "chat.completion.chunk", "created": created,
                "model": self.model_id}

        def chunk(delta: dict, finish=None) -> str:
            body = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
            return f"data: {json.dumps(body)}\n\n"

        audio_id = f"audio_{req.request_id[9:]}"
        pending_transcript = ""
        try:
            yield chunk({"role": "assistant", "content": ""})
            async for ev in self.events(req, stream, track):
                if ev["type"] == "text":
                    if "text" in req.modalities:
                        yield chunk({"content": ev["delta"]})
                    pending_transcript += ev["delta"]
                elif ev["type"] == "audio":
                    yield chunk({"audio": {"id": audio_id,
                                           "data": base64.b64encode(ev["pcm16"]).decode(),
                                           "transcript": pending_transcript}})
                    pending_transcript = ""
                else:
                    if req.wants_audio:  # a later turn may name this answer by its id
                        expires_at = self.transcripts.put(audio_id, ev["text"])
                        yield chunk({"audio": {"id": audio_id, "data": "",
                                               "expires_at": expires_at,
                                               "transcript": pending_transcript}})
                    yield chunk({}, ev["finish_reason"])
                    if include_usage:
                        yield f"data: {json.dumps(dict(base, choices=[], usage=ev['usage']))}\n\n"
        except StageError as e:
            logger.warning("request %s failed: %s", req.request_id, e)
            err = APIError(500, f"request {req.request_id} failed: {e}", type="server_error")
            yield f"data: {json.dumps(err.body())}\n\n"
        except (Exception, asyncio.CancelledError) as e:
            # Never cut a started stream without an error event and [DONE]. A CancelledError is
            # passed on only when this task is being cancelled (the client left); one raised by
            # an inner await (a stage call cancelled under us) is an error like any other.
            if isinstance(e, asyncio.CancelledError) and task_cancelling():
                raise
            logger.warning("request %s failed: %s", req.request_id, type(e).__name__)
            err = APIError(500, f"request {req.request_id} failed: {type(e).__name__}",
                           type="server_error")
            yield f"data: {json.dumps(err.body())}\n\n"
        finally:
            stream.close()  # also when the client left before the first event
        yield "data: [DONE]\n\n"


def media_token_ids(model_dir) -> dict:
    """The thinker's placeholder token ids: ``audio`` (an id), ``image`` (image and video ids)."""
    from pathlib import Path

    th = json.loads((Path(model_dir) / "config.json").read_text()).get("thinker_config", {})
    return {"audio": th.get("audio_token_id"),
            "image": {t for t in (th.get("image_token_id"), th.get("video_token_id")) if t}}


def task_cancelling() -> bool:
    """Whether the current task has been asked to cancel (the client disconnected)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def finish_reason(reason: FinishReason) -> str:
    return "length" if reason == FinishReason.LENGTH else "stop"
