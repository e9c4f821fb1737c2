"""Every OpenAI audio format omni_ray writes, decoded back by a different library than the one that
wrote it: soundfile's files (flac, mp3, opus) by PyAV (FFmpeg), PyAV's aac by faad (libfaad2),
the standard library's wav by soundfile, pcm16 by numpy."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import pytest

from omni_ray.audio_formats import API_AUDIO_FORMATS, encode_audio

SR = 24000
FREQ = 440.0
SECONDS = 1.5


def tone() -> np.ndarray:
    t = np.arange(int(SR * SECONDS)) / SR
    return (0.5 * np.sin(2 * np.pi * FREQ * t)).astype(np.float32)


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


def test_the_formats_are_openais():
    assert set(API_AUDIO_FORMATS) == {"wav", "mp3", "flac", "opus", "aac", "pcm16"}


def test_wav_by_soundfile_and_pcm16_by_numpy_are_exact():
    import soundfile as sf

    from omni_ray.audio import to_pcm16

    x = tone()
    want = np.frombuffer(to_pcm16(x), "<i2")
    got, sr = sf.read(io.BytesIO(encode_audio(x, "wav")), dtype="int16")
    assert sr == SR and np.array_equal(got, want)
    assert np.array_equal(np.frombuffer(encode_audio(x, "pcm16"), "<i2"), want)


def test_flac_decoded_by_pyav_is_lossless():
    from omni_ray.audio import to_pcm16

    x = tone()
    got, sr = decode_pyav(encode_audio(x, "flac"))
    assert sr == SR
    assert np.array_equal(np.rint(got * 32768).astype(np.int32),
                          np.frombuffer(to_pcm16(x), "<i2").astype(np.int32))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_lossy_formats_decode_to_the_same_tone(fmt, tmp_path):
    data = encode_audio(tone(), fmt)
    if fmt == "aac":  # written by PyAV: read by libfaad2
        if shutil.which("faad") is None:
            pytest.skip("faad (Debian's libfaad2 decoder) is not installed")
        got, sr = decode_faad(data, tmp_path)
        assert data[:2] == b"\xff\xf1"  # ADTS sync word, MPEG-4
    else:  # written by soundfile: read by PyAV
        got, sr = decode_pyav(data)
        assert data[:4] == (b"OggS" if fmt == "opus" else data[:4])
    # Opus decodes at 48 kHz; faad upsamples low rates (implicit SBR): the duration and the tone
    # are what must survive.
    assert abs(got.size / sr - SECONDS) < 0.1, (got.size, sr)
    assert abs(peak_hz(got, sr) - FREQ) < 5
    rms = float(np.sqrt(np.mean(got[sr // 10: -sr // 10] ** 2)))
    assert 0.25 < rms < 0.45  # 0.5 / sqrt(2) = 0.354


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unsupported audio format 'ogg'"):
        encode_audio(tone(), "ogg")
