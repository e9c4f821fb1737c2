"""Every OpenAI audio format omni_ray writes, decoded back by a different library than the one that
wrote it: soundfile's files (flac, mp3, opus) by PyAV (FFmpeg), PyAV's aac by faad (libfaad2),
the standard library's wav by soundfile, pcm16 by numpy."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from audio_decoders import decode_faad, decode_pyav, peak_hz

from omni_ray.audio_formats import API_AUDIO_FORMATS, encode_audio

SR = 24000
FREQ = 440.0
SECONDS = 1.5


def tone() -> np.ndarray:
    t = np.arange(int(SR * SECONDS)) / SR
    return (0.5 * np.sin(2 * np.pi * FREQ * t)).astype(np.float32)


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
