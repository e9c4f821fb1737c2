"""Waveform helpers shared by the CLI and the HTTP ingress: PCM16 bytes, WAV bytes, files.

Waveforms are mono float32 in [-1, 1] (torch or numpy). PCM16 maps them to little-endian int16 by
``round(clip(x, -1, 1) * 32767)``; NaN becomes 0 (silence) rather than an undefined cast.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np

from omni_ray.audio_formats import AUDIO_SUFFIXES, SOUNDFILE_FORMATS

DEFAULT_SAMPLE_RATE = 24000  # Hz: Qwen3-Omni's code2wav output


def to_float32(samples) -> np.ndarray:
    """A mono waveform (torch or numpy) as a 1-D float32 numpy array: what crosses to callers
    that may not have torch (DeploymentHandle events)."""
    return np.ascontiguousarray(_mono_float32(samples))


def _mono_float32(samples) -> np.ndarray:
    """A 1-D float32 numpy copy of a mono waveform (torch or numpy, singleton dims allowed)."""
    if hasattr(samples, "detach"):  # torch.Tensor, without importing torch here
        samples = samples.detach().cpu().float().numpy()
    x = np.asarray(samples, dtype=np.float32)
    if sum(d > 1 for d in x.shape) > 1:
        raise ValueError(f"expected a mono waveform, got shape {tuple(x.shape)}")
    return x.reshape(-1)


def to_pcm16(samples) -> bytes:
    """Float samples in [-1, 1] -> little-endian int16 PCM bytes (clipped; 2 bytes a sample)."""
    x = np.nan_to_num(_mono_float32(samples), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.rint(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_bytes(samples, sample_rate: int = DEFAULT_SAMPLE_RATE) -> bytes:
    """A complete PCM16 mono WAV file (header included) holding ``samples``."""
    return pcm16_wav(to_pcm16(samples), sample_rate)


def pcm16_wav(pcm16: bytes, sample_rate: int = DEFAULT_SAMPLE_RATE) -> bytes:
    """A complete mono WAV file (header included) around little-endian int16 ``pcm16``."""
    if sample_rate < 1:
        raise ValueError(f"sample_rate must be >= 1, got {sample_rate}")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm16)
    return buf.getvalue()




def write_audio(path, samples, sample_rate: int = DEFAULT_SAMPLE_RATE) -> Path:
    """Write ``samples`` to ``path`` by suffix: ``.wav`` (PCM16 mono), ``.flac`` (PCM16), ``.ogg``
    (Vorbis), ``.mp3`` or ``.npy`` (float32, lossless).

    ``.npy`` keeps no sample rate; it is the exact waveform, for comparisons. Returns the path.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".wav":
        path.write_bytes(wav_bytes(samples, sample_rate))
    elif suffix == ".npy":
        with open(path, "wb") as f:  # a file object: np.save would append ".npy" to ".NPY"
            np.save(f, _mono_float32(samples))
    elif suffix in SOUNDFILE_FORMATS:
        import soundfile as sf

        fmt, subtype = SOUNDFILE_FORMATS[suffix]
        x = np.clip(np.nan_to_num(_mono_float32(samples)), -1.0, 1.0)
        sf.write(str(path), x, int(sample_rate), format=fmt, subtype=subtype)
    else:
        raise ValueError(f"unsupported audio file type {path.suffix!r} ({path}); use "
                         f"{', '.join(AUDIO_SUFFIXES)}")
    return path
