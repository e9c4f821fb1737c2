"""Small audio clips and images for the audio/image input tests (made here, deterministic)."""

from __future__ import annotations

import base64
import io

import numpy as np


def tone(seconds: float = 1.0, rate: int = 24000, freq: float = 330.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(
        np.float32)


def audio_bytes(samples: np.ndarray, rate: int = 24000, fmt: str = "wav",
                subtype: str | None = None) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt.upper(), subtype=subtype)
    return buf.getvalue()


def picture(width: int = 96, height: int = 64, seed: int = 0):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(height, width, 3) * 255).astype(np.uint8))


def image_bytes(img, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"
