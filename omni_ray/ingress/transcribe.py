"""``POST /v1/audio/transcriptions``: OpenAI's multipart request, answered by the thinker.

Qwen3-Omni has no transcription head: the thinker gets one user turn holding the audio and an
instruction (``instruction()``), text out, greedy unless ``temperature`` says otherwise: the same
request as through ``/v1/chat/completions``, so the two answer alike. Fields the model cannot
honour (timestamps, log probabilities, diarization, streaming, chunking) are a 400 naming them.
"""

from __future__ import annotations

import base64
import io

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.datastructures import UploadFile

from omni_ray.ingress.errors import APIError, bad_request

INSTRUCTION = "Transcribe the audio into text. Answer with the transcript only."
RESPONSE_FORMATS = ("json", "text", "verbose_json")
_UNSUPPORTED_FORMATS = ("srt", "vtt", "diarized_json")  # need timestamps / speakers
# Honoured form fields; any other is a 400 naming it.
FIELDS = ("file", "model", "response_format", "language", "prompt", "temperature")
# OpenAI's fields this server cannot honour: accepted only with a value that asks for nothing.
_NO_OP = {"stream": ("false",), "chunking_strategy": (), "include[]": (), "include": (),
          "timestamp_granularities[]": (), "timestamp_granularities": (),
          "known_speaker_names[]": (), "known_speaker_references[]": ()}
# soundfile's name of the uploaded file's format -> input_audio.format
_FILE_FORMATS = {"WAV": "wav", "WAVEX": "wav", "MP3": "mp3"}


def instruction(language: str | None = None, prompt: str | None = None) -> str:
    """The user turn's text after the audio."""
    text = INSTRUCTION
    if language:
        text += f" The speech is in {language}."
    if prompt:
        text += f" Context (earlier words, spellings): {prompt}"
    return text


async def read_form(request: Request, limits) -> dict:
    """The multipart form as a dict (``file`` as bytes plus ``filename``), checked."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise bad_request("the request must be multipart/form-data (file, model, ...)",
                          code="invalid_body")
    try:
        form = await request.form(max_files=1, max_fields=32)
    except Exception as e:  # noqa: BLE001 - a malformed body; Starlette raises several types
        raise bad_request(f"cannot read the multipart form: {e}", code="invalid_body") from None
    out: dict = {}
    for key, value in form.multi_items():
        if key in out:
            raise bad_request(f"{key}: given more than once", key)
        if key not in FIELDS and key not in _NO_OP:
            raise APIError(400, f"{key}: unrecognized request argument", param=key,
                           code="unknown_parameter")
        if key == "file":
            if not isinstance(value, UploadFile):
                raise bad_request("file: must be an uploaded file", "file")
            data = await value.read(limits.max_audio_bytes + 1)
            if len(data) > limits.max_audio_bytes:
                raise bad_request(f"file: over limits.max_audio_bytes={limits.max_audio_bytes}",
                                  "file", code="audio_too_large")
            out["file"], out["filename"] = data, value.filename or ""
            continue
        if isinstance(value, UploadFile):
            raise bad_request(f"{key}: must be a form field, not a file", key)
        if key in _NO_OP:
            if value.strip().lower() not in _NO_OP[key]:
                raise bad_request(f"{key}: not supported by this server"
                                  + (" (accepted only as false)" if _NO_OP[key] else ""),
                                  key, code="unsupported_parameter")
            continue
        out[key] = value
    return check_form(out)


def form_from_body(body: dict, limits) -> dict:
    """A ``DeploymentHandle`` caller's request (``{"model", "file": bytes, "language",
    "prompt", "temperature"}``) as ``read_form`` gives it, checked alike."""
    if not isinstance(body, dict):
        raise bad_request("the request must be a dict (model, file, ...)", code="invalid_body")
    out: dict = {}
    for key, value in body.items():
        if key not in FIELDS or key == "response_format":
            raise APIError(400, f"{key}: unrecognized request argument", param=key,
                           code="unknown_parameter")
        if key == "file":
            if not isinstance(value, bytes | bytearray):
                raise bad_request("file: must be the audio file's bytes", "file")
            if len(value) > limits.max_audio_bytes:
                raise bad_request(f"file: over limits.max_audio_bytes={limits.max_audio_bytes}",
                                  "file", code="audio_too_large")
            out["file"], out["filename"] = bytes(value), ""
        elif key == "temperature":
            out[key] = str(value)
        elif not isinstance(value, str):
            raise bad_request(f"{key}: must be a string", key)
        else:
            out[key] = value
    return check_form(out)


def check_form(out: dict) -> dict:
    """The checks of the fields' values common to both ways in; adds ``file_format`` and
    ``duration``."""
    for key in ("file", "model"):
        if key not in out:
            raise bad_request(f"{key}: required", key, code="missing_required_parameter")
    fmt = out.get("response_format", "json")
    if fmt not in RESPONSE_FORMATS:
        why = ("needs timestamps or speakers, which this model does not give"
               if fmt in _UNSUPPORTED_FORMATS else "unknown")
        raise bad_request(f"response_format: {fmt!r} {why}; use {', '.join(RESPONSE_FORMATS)}",
                          "response_format", code="unsupported_value")
    out["response_format"] = fmt
    if "temperature" in out:
        try:
            out["temperature"] = float(out["temperature"])
        except ValueError:
            raise bad_request("temperature: must be a number", "temperature") from None
        if not 0.0 <= out["temperature"] <= 1.0:
            raise bad_request("temperature: must be between 0 and 1", "temperature")
    out["file_format"], out["duration"] = _file_format(out["file"])
    return out


def _file_format(data: bytes) -> tuple[str, float]:
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - libsndfile's errors carry no useful type
        raise bad_request("file: cannot decode the audio (wav or mp3)", "file",
                          code="invalid_audio") from None
    fmt = _FILE_FORMATS.get(info.format)
    if fmt is None:
        raise bad_request(f"file: {info.format} audio is not supported; use wav or mp3", "file",
                          code="invalid_audio_format")
    return fmt, float(info.duration)


def chat_body(form: dict, limits) -> dict:
    """The chat completion request the thinker answers."""
    audio = base64.b64encode(form["file"]).decode()
    return {"model": form["model"], "modalities": ["text"],
            "temperature": form.get("temperature", 0.0), "max_tokens": limits.default_max_tokens,
            "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": audio,
                                                        "format": form["file_format"]}},
                {"type": "text", "text": instruction(form.get("language"), form.get("prompt"))}]}]}


def as_file_error(e: APIError) -> APIError:
    """An error about the chat request's audio part as one about ``file``."""
    if e.param and e.param.startswith("messages.0.content.0"):
        e.message = e.message.replace(f"{e.param}:", "file:", 1)
        e.param = "file"
    return e


def usage(u: dict) -> dict:
    """A chat answer's ``usage`` as a transcription's (``type: tokens``)."""
    p = u["prompt_tokens_details"]
    return {"type": "tokens", "input_tokens": u["prompt_tokens"],
            "input_token_details": {"audio_tokens": p["audio_tokens"],
                                    "text_tokens": p["text_tokens"]},
            "output_tokens": u["completion_tokens"], "total_tokens": u["total_tokens"]}


def response(form: dict, answer: dict):
    """OpenAI's transcription answer in ``response_format``."""
    text = answer["choices"][0]["message"]["content"] or ""
    usage_ = usage(answer["usage"])
    fmt = form["response_format"]
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "json":
        return JSONResponse({"text": text, "usage": usage_})
    # No segments or words: the thinker gives no timestamps (and none is made up here).
    seconds = round(form["duration"], 3)
    return JSONResponse({"task": "transcribe", "language": form.get("language") or "unknown",
                         "duration": seconds, "text": text,
                         "usage": {"type": "duration", "seconds": seconds}})
