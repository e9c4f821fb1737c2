"""``POST /v1/audio/speech``: OpenAI's text-to-speech request, voiced by the talker.

The thinker does not answer: the prompt is one user turn holding ``input`` and the answer is
``input`` itself (``OmniRequest.answer_token_ids``; models/tokenizer.py ``speech_ids``), so the
talker and code2wav voice exactly the given text, and exactly as the chat path voices the same
answer ids after the same prompt. ``speed`` other than 1 and ``instructions`` are a 400 naming
them (the talker has no pace or style control). The audio is bounded by the text: at most
``FRAMES_BASE + FRAMES_PER_TOKEN`` x tokens codec frames (80 ms each; far more than speech
takes) and ``limits.max_audio_frames``; ``max_audio_frames`` (this server's extension, as in chat)
lowers it.

Answers: ``stream_format: "audio"`` (the default) sends the file in ``response_format``; ``pcm``
is streamed as it is made (raw 24 kHz mono little-endian int16), the other formats once the
audio is complete. ``stream_format: "sse"`` sends ``speech.audio.delta`` events (base64 pcm, so
``response_format`` must be ``pcm``) and one ``speech.audio.done`` with ``usage``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Literal

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from omni_ray.audio_formats import API_AUDIO_FORMATS, encode_audio
from omni_ray.config.defaults import MAX_SPEECH_INPUT_CHARS

# OpenAI's speech formats -> ours (chat's pcm16 is the speech API's pcm)
FORMATS = {"mp3": "mp3", "opus": "opus", "aac": "aac", "flac": "flac", "wav": "wav", "pcm": "pcm16"}
MAX_INPUT_CHARS = MAX_SPEECH_INPUT_CHARS  # OpenAI's limit
FRAMES_BASE, FRAMES_PER_TOKEN = 25, 12  # the audio's bound: 2 s + ~1 s a token (speech: ~0.3 s)


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=256)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    voice: str | VoiceRef
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    stream_format: Literal["audio", "sse"] = "audio"
    max_audio_frames: int | None = Field(None, ge=1)  # this server's extension (as in chat)

    @field_validator("input")
    @classmethod
    def _has_text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must contain text to speak")
        return v

    @field_validator("speed")
    @classmethod
    def _speed(cls, v: float) -> float:
        if v != 1.0:
            raise ValueError("only 1.0 is supported (the talker has no pace control)")
        return v

    @field_validator("instructions")
    @classmethod
    def _instructions(cls, v: str | None) -> str | None:
        if v is not None and v.strip():
            raise ValueError("not supported (the talker takes no voice instructions)")
        return v

    @field_validator("stream_format")
    @classmethod
    def _sse_is_pcm(cls, v: str, info: ValidationInfo) -> str:
        if v == "sse" and info.data.get("response_format", "pcm") != "pcm":
            raise ValueError("'sse' sends base64 pcm deltas: use response_format 'pcm' with it "
                             "(or stream_format 'audio')")
        return v

    @property
    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id

    def frames(self, answer_tokens: int, limit: int) -> int:
        """The most codec frames this request may make."""
        bound = min(FRAMES_BASE + FRAMES_PER_TOKEN * answer_tokens, limit)
        return bound if self.max_audio_frames is None else min(self.max_audio_frames, bound)


async def response(body: SpeechRequest, events: AsyncIterator[dict], fail) -> Response:
    """The HTTP answer for ``events`` (the ingress's plain event stream of the request).
    ``fail(exc)`` maps a stage failure to the ``APIError`` to answer (or to send as an SSE error
    event); a raw pcm stream that fails after its first bytes can only end early."""
    fmt = FORMATS[body.response_format]
    if body.stream_format == "sse":
        return StreamingResponse(_sse(events, fail), media_type="text/event-stream")
    if fmt == "pcm16":
        return StreamingResponse(_pcm(events), media_type=API_AUDIO_FORMATS["pcm16"])
    import numpy as np

    try:
        pieces = [ev["samples"] async for ev in events
                  if ev["type"] == "audio" and ev["num_samples"]]
    except Exception as e:  # noqa: BLE001 - a stage failed: an error status, no audio
        raise fail(e) from e
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    data = await asyncio.to_thread(encode_audio, samples, fmt)
    return Response(data, media_type=API_AUDIO_FORMATS[fmt])


async def _pcm(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    async for ev in events:
        if ev["type"] == "audio" and ev["num_samples"]:
            yield ev["pcm16"]


async def _sse(events: AsyncIterator[dict], fail) -> AsyncIterator[str]:
    try:
        async for ev in events:
            if ev["type"] == "audio" and ev["num_samples"]:
                yield _event({"type": "speech.audio.delta",
                              "audio": base64.b64encode(ev["pcm16"]).decode()})
            elif ev["type"] == "done":
                u = ev["usage"]
                yield _event({"type": "speech.audio.done", "usage": {
                    "input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                    "total_tokens": u["total_tokens"]}})
    except Exception as e:  # noqa: BLE001 - the stream ends with an error event, never silently
        yield _event(fail(e).body())


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
