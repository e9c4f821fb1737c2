"""OpenAI's Realtime protocol, the subset a voice agent needs (GA names, as ``openai``'s
``openai.types.realtime`` types them; a few beta names accepted on input).

Client events are pydantic models (validated here, errors name the field); server events are
plain dicts built by ``ServerEvents`` (each parses as ``openai.types.realtime.RealtimeServerEvent``:
tests/serve/test_realtime.py checks every one the tests see).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omni_ray.config.defaults import REALTIME_SAMPLE_RATE


class Model(BaseModel):
    """Unknown fields ignored (clients send more than this server honours); known ones typed."""

    model_config = ConfigDict(extra="ignore")


# -- session ------------------------------------------------------------------------------------
class PCMFormat(Model):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = REALTIME_SAMPLE_RATE


class ServerVad(Model):
    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0, le=1)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=30, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


class AudioInput(Model):
    format: PCMFormat = Field(default_factory=PCMFormat)
    turn_detection: ServerVad | None = None


class AudioOutput(Model):
    format: PCMFormat = Field(default_factory=PCMFormat)
    voice: str = "ethan"
    speed: float = Field(1.0, ge=1.0, le=1.0, description="only 1.0: the talker has no speed")


class SessionAudio(Model):
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class Session(Model):
    """``session`` of ``session.update`` / ``session.created`` (``type: "realtime"``)."""

    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str = ""
    output_modalities: list[Literal["text", "audio"]] = Field(["audio"], min_length=1,
                                                              max_length=1)
    audio: SessionAudio = Field(default_factory=SessionAudio)
    max_output_tokens: int | Literal["inf"] = "inf"

    def public(self) -> dict:
        return self.model_dump(exclude_none=False)


def beta_session(s: dict) -> dict:
    """The beta API's flat session fields (``modalities``, ``voice``, ``turn_detection``,
    ``input_audio_format``/``output_audio_format`` "pcm16", ``max_response_output_tokens``) in the
    GA shape; a GA session is returned as it is."""
    if not isinstance(s, dict):
        return s
    out = dict(s)
    audio: dict = {**(out.pop("audio", None) or {})}
    inp, outp = dict(audio.get("input") or {}), dict(audio.get("output") or {})
    if "modalities" in out:
        mods = out.pop("modalities")
        out["output_modalities"] = ["audio"] if isinstance(mods, list) and "audio" in mods else mods
    if "voice" in out:
        outp["voice"] = out.pop("voice")
    if "turn_detection" in out:
        inp["turn_detection"] = out.pop("turn_detection")
    for key, side in (("input_audio_format", inp), ("output_audio_format", outp)):
        if key in out:
            fmt = out.pop(key)
            side["format"] = {"type": "audio/pcm", "rate": 24000} if fmt == "pcm16" else {
                "type": fmt}
    if "max_response_output_tokens" in out:
        out["max_output_tokens"] = out.pop("max_response_output_tokens")
    if inp:
        audio["input"] = inp
    if outp:
        audio["output"] = outp
    if audio:
        out["audio"] = audio
    return out


# -- client events ------------------------------------------------------------------------------
class SessionUpdate(Model):
    type: Literal["session.update"]
    event_id: str | None = None
    session: dict


class BufferAppend(Model):
    type: Literal["input_audio_buffer.append"]
    event_id: str | None = None
    audio: str


class BufferCommit(Model):
    type: Literal["input_audio_buffer.commit"]
    event_id: str | None = None


class BufferClear(Model):
    type: Literal["input_audio_buffer.clear"]
    event_id: str | None = None


class ContentPart(Model):
    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None       # base64 pcm16 24 kHz (input_audio)
    transcript: str | None = None


class Item(Model):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(min_length=1)


class ItemCreate(Model):
    type: Literal["conversation.item.create"]
    event_id: str | None = None
    previous_item_id: str | None = None
    item: Item


class ItemTruncate(Model):
    type: Literal["conversation.item.truncate"]
    event_id: str | None = None
    item_id: str
    content_index: int = Field(0, ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreate(Model):
    type: Literal["response.create"]
    event_id: str | None = None
    response: dict | None = None  # per-response overrides: instructions, output_modalities, ...


class ResponseCancel(Model):
    type: Literal["response.cancel"]
    event_id: str | None = None
    response_id: str | None = None


CLIENT_EVENTS = {m.model_fields["type"].annotation.__args__[0]: m for m in (
    SessionUpdate, BufferAppend, BufferCommit, BufferClear, ItemCreate, ItemTruncate,
    ResponseCreate, ResponseCancel)}


class ProtocolError(Exception):
    """A client event this server refuses: answered with an ``error`` event, the socket kept."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 event_id: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.event_id = message, param, code, event_id
        self.type = type


def parse_client_event(raw: str | bytes) -> BaseModel:
    """One client message as its event model; ``ProtocolError`` naming the field otherwise."""
    import json

    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ProtocolError(f"the message is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProtocolError("an event must be a JSON object", code="invalid_event")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    model = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ProtocolError(f"Invalid value: {str(kind)[:64]!r}. Supported values are: "
                            f"{', '.join(CLIENT_EVENTS)}.", "type", "invalid_value", event_id)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation(e, event_id=event_id) from None


def from_validation(e: ValidationError, prefix: str = "", event_id: str | None = None
                    ) -> ProtocolError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if not str(p).startswith(("function-",)))
    param = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or None)
    return ProtocolError(f"{param}: {err.get('msg')}" if param else str(err.get("msg")),
                         param, "invalid_value", event_id)


def decode_audio(b64: str, param: str, event_id: str | None = None) -> bytes:
    """base64 pcm16 (little-endian) as bytes; an odd byte count or bad base64 is an error."""
    try:
        pcm = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{param}: not valid base64", param, "invalid_base64",
                            event_id) from None
    if len(pcm) % 2:
        raise ProtocolError(f"{param}: pcm16 audio has an even number of bytes (got {len(pcm)})",
                            param, "invalid_audio", event_id)
    return pcm


# -- server events ------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ServerEvents:
    """Builds server events (dicts) with unique ``event_id``s."""

    def __init__(self) -> None:
        self._n = itertools.count(1)
        self._base = uuid.uuid4().hex[:12]

    def __call__(self, type: str, **fields: Any) -> dict:
        return {"type": type, "event_id": f"event_{self._base}{next(self._n)}", **fields}

    def error(self, e: ProtocolError) -> dict:
        return self("error", error={"type": e.type, "code": e.code, "message": e.message,
                                    "param": e.param, "event_id": e.event_id})


# GA name -> the beta protocol's (None: no beta event); beta clients send the same client events.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.created": None,  # GA sends both; beta's comes from "added"
    "conversation.item.done": None,
}


def beta_event(event: dict) -> dict | None:
    """``event`` under its beta name (or None when the beta protocol has no such event)."""
    if event["type"] not in BETA_NAMES:
        return event
    name = BETA_NAMES[event["type"]]
    return None if name is None else {**event, "type": name}


def user_item(item_id: str, parts: list[dict]) -> dict:
    return {"id": item_id, "type": "message", "object": "realtime.item", "status": "completed",
            "role": "user", "content": parts}


def assistant_item(item_id: str, modality: str, status: str, text: str = "") -> dict:
    part = ({"type": "output_audio", "transcript": text} if modality == "audio"
            else {"type": "output_text", "text": text})
    return {"id": item_id, "type": "message", "object": "realtime.item", "status": status,
            "role": "assistant", "content": [part]}


def response_obj(response_id: str, status: str, modality: str, voice: str, *,
                 output: list | None = None, usage: dict | None = None,
                 reason: str | None = None, error: dict | None = None,
                 max_output_tokens: int | str = "inf") -> dict:
    details = None
    if status != "in_progress":
        details = {"type": status, "reason": reason, "error": error}
    return {"id": response_id, "object": "realtime.response", "status": status,
            "status_details": details, "output": output or [], "output_modalities": [modality],
            "conversation_id": None, "max_output_tokens": max_output_tokens,
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": REALTIME_SAMPLE_RATE},
                                 "voice": voice}},
            "usage": usage}


def realtime_usage(usage: dict | None) -> dict | None:
    """The chat API's ``usage`` in the Realtime shape (input/output tokens and their details)."""
    if usage is None:
        return None
    pin, pout = usage["prompt_tokens_details"], usage["completion_tokens_details"]
    return {"total_tokens": usage["total_tokens"], "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "input_token_details": {"text_tokens": pin["text_tokens"],
                                    "audio_tokens": pin["audio_tokens"],
                                    "image_tokens": pin["image_tokens"], "cached_tokens": 0},
            "output_token_details": {"text_tokens": pout["text_tokens"],
                                     "audio_tokens": pout["audio_tokens"]}}


__all__ = ["Session", "ServerVad", "ProtocolError", "ServerEvents", "parse_client_event",
           "decode_audio", "beta_session", "new_id"]
