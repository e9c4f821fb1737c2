"""Decoders for the tests of omni_ray's audio answers, each another library than the writer:
PyAV (FFmpeg) for soundfile's flac/mp3/opus, faad (libfaad2, Debian's CLI) for PyAV's aac."""

from __future__ import annotations

import io
import subprocess
import wave

import numpy as np


def peak_hz(x: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / sr)[spec.argmax()])


def decode_pyav(data: bytes) -> tuple[np.ndarray, int]:
    import av

    with av.open(io.BytesIO(data)) as f:
        frames = [_first_channel(fr) for fr in f.decode(audio=0)]
        sr = f.streams.audio[0].sample_rate
    return np.concatenate(frames), sr


def _first_channel(frame) -> np.ndarray:
    """One PyAV frame's first channel as float32 in [-1, 1] (FLAC decodes to ints, the rest to
    floats; packed formats interleave the channels)."""
    a = frame.to_ndarray()
    a = a.reshape(frame.samples, -1)[:, 0] if frame.format.is_packed else a[0]
    if np.issubdtype(a.dtype, np.integer):
        return a.astype(np.float32) / float(np.iinfo(a.dtype).max + 1)
    return a.astype(np.float32)


def decode_faad(data: bytes, tmp_path) -> tuple[np.ndarray, int]:
    src, dst = tmp_path / "a.aac", tmp_path / "a.wav"
    src.write_bytes(data)
    subprocess.run(["faad", "-q", "-o", str(dst), str(src)], check=True, timeout=60)
    with wave.open(str(dst)) as w:
        assert w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels())
        return pcm[:, 0].astype(np.float32) / 32768, w.getframerate()
