"""Dataset rows in, ``OmniRequest``s out; the output row's audio column.

A row holds ``messages`` (OpenAI's chat shape: string content, or parts of type ``text``,
``input_audio`` with base64 ``data`` and ``format``, ``image_url`` with a ``data:`` URL; a JSON
string of them works too) or a ``prompt`` string, and optionally ``id``, ``voice``,
``max_tokens``, ``max_audio_frames``, ``modalities``, ``temperature``, ``top_p``, ``seed``. A row
that cannot become a request gets an ``error`` naming its field; the job goes on.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np

from omni_ray.config.request import OmniRequest
from omni_ray.config.sampling import TALKER_GREEDY, THINKER_GREEDY, SamplingParams

ROW_FIELDS = ("id", "messages", "prompt", "voice", "max_tokens", "max_audio_frames",
              "modalities", "temperature", "top_p", "seed")


class RowError(ValueError):
    """A row that cannot become a request: ``field`` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def plain(x: Any) -> Any:
    """Ray Data hands nested columns back as numpy arrays (lists) and numpy scalars, and a
    missing value of a number column as NaN: plain Python values again (NaN -> None, integral
    floats -> int)."""
    if isinstance(x, np.ndarray):
        return [plain(v) for v in x.tolist()] if x.dtype == object else x.tolist()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        if x != x:
            return None
        return int(x) if x.is_integer() else x
    return x


def row_id(row: dict) -> str:
    rid = plain(row.get("id"))
    return str(rid) if rid is not None and str(rid) != "" else f"row-{uuid.uuid4().hex}"


def chat_messages(row: dict, limits) -> list[dict]:
    """The row's conversation as the input processor takes it (media decoded, limits applied)."""
    from omni_ray.inputs.audio import decode_audio, decode_base64
    from omni_ray.inputs.errors import InputError
    from omni_ray.inputs.image import data_url_bytes, decode_image

    msgs, prompt = plain(row.get("messages")), plain(row.get("prompt"))
    if isinstance(msgs, str):
        try:
            msgs = json.loads(msgs)
        except json.JSONDecodeError as e:
            raise RowError("messages", f"not valid JSON: {e}") from None
    if msgs is None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise RowError("messages", "a row needs `messages` or a non-empty `prompt`")
        msgs = [{"role": "user", "content": prompt}]
    if not isinstance(msgs, list) or not msgs:
        raise RowError("messages", "must be a non-empty list of chat messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RowError(f"messages.{i}", "must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise RowError(f"messages.{i}.role", f"unknown role {role!r}")
        role = "system" if role == "developer" else role
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list) or not content:
            raise RowError(f"messages.{i}.content", "must be a string or a list of parts")
        parts = []
        for j, p in enumerate(content):
            f = f"messages.{i}.content.{j}"
            kind = p.get("type") if isinstance(p, dict) else None
            try:
                if kind == "text" and isinstance(p.get("text"), str):
                    parts.append({"type": "text", "text": p["text"]})
                elif kind == "input_audio" and isinstance(p.get("input_audio"), dict):
                    a = p["input_audio"]
                    data = decode_base64(a.get("data") or "", "input_audio.data")
                    parts.append({"type": "audio", "audio": decode_audio(
                        data, a.get("format") or "wav", max_seconds=limits.max_audio_seconds)})
                elif kind == "image_url" and isinstance(p.get("image_url"), dict):
                    url = (p["image_url"].get("url") or "").strip()
                    if url[:5].lower() != "data:":
                        raise RowError(f"{f}.image_url.url", "only data: URLs are read in batch "
                                                             "jobs (no fetching)")
                    parts.append({"type": "image", "image": decode_image(
                        data_url_bytes(url), max_pixels=limits.max_image_pixels)})
                else:
                    raise RowError(f"{f}.type", f"unsupported content part {kind!r}")
            except InputError as e:
                raise RowError(f"{f}.{e.field}", e.message) from None
            if parts[-1]["type"] != "text" and role != "user":
                raise RowError(f"{f}.type", "audio and image parts go in user messages only")
        out.append({"role": role, "content": parts})
    return out


def build_request(row: dict, cfg, inputs, speakers: list[str], raw_media: bool) -> OmniRequest:
    """The row's ``OmniRequest`` (``cfg``: the processor's ``OmniProcessorConfig``)."""
    from omni_ray.models.speakers import resolve_speaker

    lim = cfg.limits
    mods = plain(row.get("modalities"))
    modalities = tuple(mods) if mods else ("text", "audio")
    if not set(modalities) <= {"text", "audio"} or "text" not in modalities:
        raise RowError("modalities", f"expected ['text'] or ['text', 'audio'], got {mods}")
    if "audio" in modalities and not cfg.audio:
        raise RowError("modalities", "this processor is text only (OmniProcessorConfig.audio)")
    try:
        speaker = resolve_speaker(plain(row.get("voice")) or cfg.default_voice, speakers)
    except ValueError as e:
        raise RowError("voice", str(e)) from None
    max_tokens = _int(row, "max_tokens", cfg.default_max_tokens, lim.max_tokens)
    frames = _int(row, "max_audio_frames", cfg.default_max_audio_frames, lim.max_audio_frames)
    messages = chat_messages(row, lim)
    try:
        ids, mm = inputs.build(messages, raw_media=raw_media)
    except ValueError as e:
        raise RowError("messages", f"cannot process the input: {e}") from None
    if len(ids) + max_tokens > cfg.max_model_len:
        raise RowError("messages", f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) "
                                   f"exceeds max_model_len {cfg.max_model_len}")
    thinker = cfg.thinker.engine.default_sampling or THINKER_GREEDY  # as Omni's and the app's
    over = {k: plain(row.get(k)) for k in ("temperature", "top_p", "seed")
            if plain(row.get(k)) is not None}
    if over:
        try:
            thinker = SamplingParams.model_validate({**thinker.model_dump(), **over})
        except ValueError as e:
            raise RowError("sampling", str(e).splitlines()[0]) from None
    talker = cfg.talker.engine.default_sampling or TALKER_GREEDY
    return OmniRequest(request_id=row_id(row), prompt_token_ids=ids, mm=mm, modalities=modalities,
                       speaker=speaker, max_tokens=max_tokens, max_audio_frames=frames,
                       thinker_sampling=thinker, talker_sampling=talker)


def _int(row: dict, name: str, default: int, limit: int) -> int:
    v = plain(row.get(name))
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
        raise RowError(name, f"expected an integer in 1..{limit}, got {v!r}")
    return v


def audio_value(samples: np.ndarray | None, fmt: str):
    """The ``audio`` column's value: float32 samples, or the bytes of ``fmt`` (None: no audio)."""
    if samples is None:
        return np.zeros(0, np.float32) if fmt == "float32" else None
    if fmt == "float32":
        return samples.astype(np.float32, copy=False)
    from omni_ray.audio_formats import encode_audio

    return encode_audio(samples, fmt)
