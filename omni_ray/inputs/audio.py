"""Decode an input audio clip (wav or mp3 bytes) to what the audio encoder expects.

soundfile (libsndfile) reads both formats; soxr resamples to the feature extractor's rate. The
duration is checked from the header before the samples are decoded.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

from omni_ray.inputs.errors import InputError

SAMPLE_RATE = 16000  # Qwen3-Omni's audio encoder (Whisper features) reads 16 kHz mono
_FORMATS = {"wav": ("WAV", "WAVEX", "RF64"), "mp3": ("MP3", "MPEG")}
FIELD = "input_audio.data"
MIN_RATE, MAX_RATE = 8000, 384000  # sample rates real recordings use; others are refused
MIN_SECONDS = 0.1  # shorter clips give the feature extractor nothing to pad (a 500 before)


def decode_audio(data: bytes, fmt: str, *, max_seconds: float) -> np.ndarray:
    """``data`` in ``fmt`` ("wav" | "mp3") -> float32 mono samples at 16 kHz.

    Raises ``InputError`` for undecodable data, a format other than the declared one, an empty
    clip, or one longer than ``max_seconds``."""
    import soundfile as sf

    if fmt not in _FORMATS:
        raise InputError(f"unsupported audio format {fmt!r}; use one of {sorted(_FORMATS)}",
                         "input_audio.format", "invalid_audio_format")
    try:
        f = sf.SoundFile(io.BytesIO(data))
    except Exception as e:  # libsndfile's errors carry no useful type
        raise InputError(f"cannot decode the audio as {fmt}: {_reason(e)}", FIELD,
                         "invalid_audio") from None
    with f:
        if f.format not in _FORMATS[fmt]:
            raise InputError(f"the audio is {f.format}, not the declared format {fmt!r}",
                             "input_audio.format", "invalid_audio_format")
        if f.samplerate <= 0 or f.frames <= 0:
            raise InputError("the audio clip is empty", FIELD, "invalid_audio")
        if not MIN_RATE <= f.samplerate <= MAX_RATE:
            # Checked before decoding: a header claiming 1 Hz would make a few bytes "long".
            raise InputError(f"the audio's sample rate {f.samplerate} Hz is outside "
                             f"{MIN_RATE}-{MAX_RATE} Hz", FIELD, "invalid_audio")
        seconds = f.frames / f.samplerate
        if seconds < MIN_SECONDS:
            raise InputError(f"the audio lasts {seconds * 1000:.1f} ms, under {MIN_SECONDS:g} s",
                             FIELD, "audio_too_short")
        if seconds > max_seconds:
            raise InputError(f"the audio lasts {seconds:.1f} s, over limits.max_audio_seconds="
                             f"{max_seconds:g}", FIELD, "audio_too_long")
        try:
            samples = f.read(dtype="float32", always_2d=True)
        except Exception as e:
            raise InputError(f"cannot decode the audio as {fmt}: {_reason(e)}", FIELD,
                             "invalid_audio") from None
        rate = f.samplerate
    if samples.shape[0] == 0:
        raise InputError("the audio clip is empty", FIELD, "invalid_audio")
    mono = samples.mean(axis=1, dtype=np.float32)
    if not np.isfinite(mono).all():
        raise InputError("the audio holds non-finite samples", FIELD, "invalid_audio")
    if rate != SAMPLE_RATE:
        import soxr

        mono = soxr.resample(mono, rate, SAMPLE_RATE).astype(np.float32)
    return mono


def _reason(e: Exception) -> str:
    return str(e).split(": ")[-1][:120] or type(e).__name__


def decode_base64(data: str, field: str = FIELD) -> bytes:
    """Strict base64 (whitespace allowed), as in ``input_audio.data``."""
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InputError("not valid base64", field, "invalid_base64") from None
