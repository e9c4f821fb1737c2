"""Shared by the media-input Serve tests (test_media_input.py, test_vllm_app.py): the question with
audio and image parts, one answer through the openai client, and the offline pipeline's answer."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
from media_samples import audio_bytes, b64, data_url, image_bytes, picture, tone
from openai import OpenAI

QUESTION = "What do you hear and see?"
WAV = audio_bytes(tone(1.5), 24000, "wav", "PCM_16")
MP3 = audio_bytes(tone(1.5), 24000, "mp3")
PNG = image_bytes(picture(96, 64))


def audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


def image_part(data: bytes = PNG, mime: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data, mime)}}


def ask(url: str, parts: list[dict], stream: bool, max_tokens=10, frames=30):
    """(text, pcm16 int16 array) from the openai client."""
    c = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    kw = dict(model="qwen3-omni", max_tokens=max_tokens, modalities=["text", "audio"],
              messages=[{"role": "user", "content": parts + [{"type": "text", "text": QUESTION}]}],
              audio={"voice": "ethan", "format": "pcm16" if stream else "wav"},
              extra_body={"max_audio_frames": frames})
    if not stream:
        msg = c.chat.completions.create(**kw).choices[0].message
        with wave.open(io.BytesIO(base64.b64decode(msg.audio.data))) as w:
            return msg.content, np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    text, pcm = [], []
    for ch in c.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        text.append(d.content or "")
        audio = getattr(d, "audio", None) or (d.model_extra or {}).get("audio")
        data = (audio.get("data") if isinstance(audio, dict) else getattr(audio, "data", None))
        if data:
            pcm.append(np.frombuffer(base64.b64decode(data), dtype="<i2"))
    return "".join(text), np.concatenate(pcm)


def offline_answer(omni, media: list[tuple[str, bytes, str]], max_tokens=10, frames=30):
    """The offline pipeline on the same bytes, decoded by the same functions as the ingress."""
    from omni_ray.audio import to_pcm16
    from omni_ray.inputs.audio import decode_audio
    from omni_ray.inputs.image import decode_image

    parts = [{"type": "audio", "audio": decode_audio(data, fmt, max_seconds=300)} if kind == "audio"
             else {"type": "image", "image": decode_image(data, max_pixels=1 << 24)}
             for kind, data, fmt in media]
    req = omni.request([{"role": "user", "content": parts + [{"type": "text", "text": QUESTION}]}],
                       request_id="ref", speaker="ethan", max_tokens=max_tokens,
                       max_audio_frames=frames)
    out = omni.generate(req)[0]
    return out.text, np.frombuffer(to_pcm16(out.audio), dtype="<i2")


CASES = {
    "wav": ([audio_part(WAV)], [("audio", WAV, "wav")]),
    "mp3+png": ([audio_part(MP3, "mp3"), image_part()], [("audio", MP3, "mp3"),
                                                         ("image", PNG, "")]),
    "jpeg": ([image_part(image_bytes(picture(64, 96, seed=3), "JPEG"), "image/jpeg")],
             [("image", image_bytes(picture(64, 96, seed=3), "JPEG"), "")]),
}
