"""Shared by the text chat Serve tests (test_openai_e2e.py, test_vllm_app.py): one answer through
the openai client, and the offline pipeline's answer to the same prompt."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
from openai import OpenAI

PROMPT = "Hello there, how are you?"


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def ask(url, text=PROMPT, modalities=("text", "audio"), stream=False, voice="chelsie",
        max_tokens=16, frames=40, extra=None):
    """One request (``extra``: more of omni_ray's fields); returns (text, pcm16 int16 array or
    None, finish_reason, usage)."""
    c = client(url)
    kw = dict(model="qwen3-omni", messages=[{"role": "user", "content": text}],
              modalities=list(modalities), max_tokens=max_tokens,
              extra_body={"max_audio_frames": frames, **(extra or {})})
    if "audio" in modalities:
        kw["audio"] = {"voice": voice, "format": "pcm16" if stream else "wav"}
    if not stream:
        r = c.chat.completions.create(**kw)
        msg = r.choices[0].message
        pcm = None
        if msg.audio is not None:
            with wave.open(io.BytesIO(base64.b64decode(msg.audio.data))) as w:
                assert w.getframerate() == 24000 and w.getsampwidth() == 2
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return msg.content, pcm, r.choices[0].finish_reason, r.usage
    text, pcm, finish, usage = [], [], None, None
    for ch in c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        usage = ch.usage or usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        finish = ch.choices[0].finish_reason or finish
        if d.content:
            text.append(d.content)
        data = audio_data(d)
        if data:
            pcm.append(np.frombuffer(base64.b64decode(data), dtype="<i2"))
    joined = np.concatenate(pcm) if pcm else None
    return ("".join(text) if "text" in modalities else None), joined, finish, usage


def audio_data(delta) -> str | None:
    """``delta.audio.data`` (typed in openai >= 3, a plain extra field before)."""
    audio = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio")
    if audio is None:
        return None
    return audio.get("data") if isinstance(audio, dict) else audio.data


def offline_answer(omni, text=PROMPT, voice="chelsie", max_tokens=16, frames=40,
                   ignore_eos=False):
    from omni_ray.audio import to_pcm16
    from omni_ray.config.request import OmniRequest

    req = OmniRequest(request_id="ref", prompt_token_ids=omni.prompt_ids(text), speaker=voice,
                      max_tokens=max_tokens, max_audio_frames=frames)
    if ignore_eos:
        req = req.model_copy(update={
            f"{stage}_sampling": getattr(req, f"{stage}_sampling").model_copy(
                update={"ignore_eos": True}) for stage in ("thinker", "talker")})
    out = omni.generate(req)[0]
    return out.text, np.frombuffer(to_pcm16(out.audio), dtype="<i2")
