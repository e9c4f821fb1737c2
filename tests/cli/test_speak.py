"""``omni-ray speak`` on the tiny checkpoint: the file its ``--out`` suffix names, decoded by
another library than the one that wrote it, holds the offline pipeline's answer to the same text
and voice (``Omni.speech_request``, greedy), i.e. what ``/v1/audio/speech`` answers."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
from audio_decoders import decode_pyav

from omni_ray.audio import to_pcm16
from omni_ray.cli import main
from omni_ray.offline import Omni

pytestmark = pytest.mark.slow

TEXT = "Good morning, omni ray."
FRAMES = 16
SPF, TAIL = 1920, 555  # samples per 80 ms frame; samples a decode withholds at the end


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    omni = Omni(tiny_model_dir, mode="sync")
    out = omni.generate(omni.speech_request(TEXT, speaker="aiden", max_audio_frames=FRAMES))[0]
    assert out.error is None and out.codec_frames.shape[0] == FRAMES  # noise never stops early
    return out


def _speak(capsys, model: str, out, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["speak", "--model", model, "--text", TEXT, "--voice", "Aiden", "--out", str(out),
                 "--max-audio-frames", str(FRAMES), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_wav_equals_the_offline_answer(reference, tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "x.wav"
    got = _speak(capsys, tiny_model_dir, path)  # async_chunk, the app's default mode
    x, sr = sf.read(path, dtype="int16")  # written by the standard library, read by libsndfile
    want = np.frombuffer(to_pcm16(reference.audio), "<i2")
    assert sr == 24000 and x.size == want.size == FRAMES * SPF - TAIL
    assert np.abs(x.astype(np.int32) - want).max() <= 1  # float32 rounding of the vocoder
    assert got["format"] == "wav" and got["voice"] == "aiden" and got["codec_frames"] == FRAMES


def test_mp3_and_flac_through_the_api_encoder(reference, tiny_model_dir, tmp_path, capsys):
    want = reference.audio.numpy()
    mp3, flac = tmp_path / "x.mp3", tmp_path / "x.flac"
    assert _speak(capsys, tiny_model_dir, mp3, "--mode", "sync")["format"] == "mp3"
    x, sr = decode_pyav(mp3.read_bytes())  # written by libsndfile (LAME), read by FFmpeg
    assert sr == 24000 and 0 <= x.size - want.size <= 2 * 1152  # mp3 frame padding
    x = np.pad(x, (0, 2400))
    # The codec's delay: the shift that lines the decoded audio up with the answer.
    shift = max(range(0, 1200), key=lambda s: float(np.dot(x[s:s + want.size], want)))
    corr = np.corrcoef(x[shift:shift + want.size], want)[0, 1]
    print(f"mp3: shift {shift}, correlation {corr:.3f}")
    assert corr > 0.7, corr  # the same waveform, lossy (the tiny model's noise is hard for mp3);
    # another answer (voice, text) correlates ~0

    assert _speak(capsys, tiny_model_dir, flac, "--mode", "sync")["format"] == "flac"
    y, sr = decode_pyav(flac.read_bytes())  # lossless 16-bit: the answer's pcm16 exactly
    assert sr == 24000
    pcm = np.frombuffer(to_pcm16(reference.audio), "<i2")
    assert np.array_equal(np.round(y * 32768).astype(np.int32), pcm.astype(np.int32))


@pytest.mark.parametrize("argv, message", [
    (["--out", "x.ogg"], "must end in .mp3, .opus, .aac, .flac, .wav, .pcm"),
    (["--out", "x.mp3", "--voice", "nobody"], "--voice"),
    (["--out", "x.mp3", "--text", "   "], "--text"),
    (["--out", "x.mp3", "--max-audio-frames", "0"], "positive integer"),
])
def test_bad_args_exit_2(tiny_model_dir, capsys, argv, message):
    base = ["speak", "--model", tiny_model_dir, "--text", "Hi"]
    with pytest.raises(SystemExit) as e:
        main(base + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
