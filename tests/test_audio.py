"""omni_ray.audio: PCM16 conversion, WAV bytes and audio files."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

from omni_ray.audio import to_pcm16, wav_bytes, write_audio


def test_to_pcm16_scales_rounds_and_clips():
    x = np.array([0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 1e-6, np.nan], dtype=np.float32)
    got = np.frombuffer(to_pcm16(x), dtype="<i2")
    assert got.tolist() == [0, 32767, -32767, 16384, 32767, -32767, 0, 0]


def test_to_pcm16_is_little_endian_two_bytes_per_sample():
    assert to_pcm16(np.array([1.0, -1.0 / 32767])) == b"\xff\x7f\xff\xff"
    assert to_pcm16(np.zeros(0)) == b""


def test_to_pcm16_accepts_torch_and_singleton_dims():
    x = torch.linspace(-1, 1, 101)
    assert to_pcm16(x) == to_pcm16(x.numpy()) == to_pcm16(x.view(1, 1, -1))
    assert to_pcm16(x.to(torch.bfloat16)) == to_pcm16(x.to(torch.bfloat16).float())


def test_to_pcm16_rejects_multichannel():
    with pytest.raises(ValueError, match="mono"):
        to_pcm16(np.zeros((2, 10)))


def test_wav_bytes_is_a_pcm16_mono_wav():
    x = np.sin(np.arange(4800) / 10.0).astype(np.float32) * 0.5
    with wave.open(io.BytesIO(wav_bytes(x, sample_rate=16000))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (
            1, 2, 16000, 4800)
        assert w.readframes(w.getnframes()) == to_pcm16(x)
    with wave.open(io.BytesIO(wav_bytes(x))) as w:
        assert w.getframerate() == 24000


def test_wav_bytes_rejects_bad_rate():
    with pytest.raises(ValueError):
        wav_bytes(np.zeros(3), sample_rate=0)


def test_write_audio_npy_is_lossless(tmp_path):
    x = torch.randn(1000) * 1e-6  # tiny-model audio is this quiet: silent as int16
    for name in ("a.npy", "b.NPY"):
        path = write_audio(tmp_path / name, x, 24000)
        assert path == tmp_path / name and path.exists()
        got = np.load(path)
        assert got.dtype == np.float32 and np.array_equal(got, x.numpy())


def test_write_audio_wav(tmp_path):
    x = np.linspace(-1, 1, 2400, dtype=np.float32)
    write_audio(tmp_path / "a.wav", x, 24000)
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert w.getframerate() == 24000 and w.getnframes() == 2400
        assert w.readframes(2400) == to_pcm16(x)


@pytest.mark.parametrize("name", ["a.aac", "a", "a.wav.gz"])
def test_write_audio_rejects_other_suffixes(tmp_path, name):
    with pytest.raises(ValueError, match=r"use \.wav, \.flac, \.ogg, \.mp3, \.npy"):
        write_audio(tmp_path / name, np.zeros(10), 24000)
    assert not (tmp_path / name).exists()
