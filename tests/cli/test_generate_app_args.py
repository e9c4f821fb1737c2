"""`omni-ray generate` as the app (issue 22): --config, voices from the checkpoint in any case,
--out by suffix, text-only loads the thinker alone, a warning for random weights, a light --help."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf

from omni_ray.cli import main
from omni_ray.config.request import OmniRequest
from omni_ray.offline import Omni


@pytest.fixture(scope="module")
def omni(tiny_model_dir) -> Omni:
    return Omni(tiny_model_dir, mode="sync")


def _run(capsys, argv: list[str]) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(argv) == 0
    got = capsys.readouterr()
    return json.loads(got.out), got.err


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["serve", "--help"]])
def test_help_imports_nothing_heavy(argv):
    code = ("import sys, time; t = time.perf_counter()\n"
            "from omni_ray.cli import main\n"
            "try:\n    main(%r)\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "heavy = [m for m in ('torch', 'transformers', 'ray', 'vllm') if m in sys.modules]\n"
            "print(heavy, time.perf_counter() - t, file=sys.stderr)\n"
            "sys.exit(1 if heavy else 0)" % argv)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert "usage: omni-ray" in proc.stdout
    print(f"omni-ray {' '.join(argv)}: {wall:.2f} s wall (python start included); "
          f"in-process {proc.stderr.split()[-1]} s")


def test_config_speaker_any_case_and_flac(omni, tiny_model_dir, tmp_path, capsys, caplog):
    """The config file's pipeline and default voice are used; --speaker CHELSIE is chelsie; .flac
    holds the PCM16 of the offline audio."""
    cfg = tmp_path / "app.yaml"
    cfg.write_text(f"applications:\n- name: omni\n  import_path: omni_ray:build_omni_app\n"
                   f"  args:\n    model: {tiny_model_dir}\n    default_speaker: aiden\n"
                   f"    pipeline: {{mode: sync}}\n    limits: {{default_max_tokens: 5, "
                   f"default_max_audio_frames: 12}}\n")
    flac = tmp_path / "a.flac"
    got, err = _run(capsys, ["generate", "--config", str(cfg), "--text", "Hello", "--json",
                             "--speaker", "CHELSIE", "--out", str(flac), "--progress"])
    want = omni.generate(OmniRequest(request_id="cli", prompt_token_ids=omni.prompt_ids("Hello"),
                                     speaker="chelsie", max_tokens=5, max_audio_frames=12))[0]
    assert (got["mode"], got["speaker"], got["model"]) == ("sync", "chelsie", tiny_model_dir)
    # status lines (forced: capsys is no terminal; tests/cli/test_progress.py has the rest)
    assert f"loading {tiny_model_dir} (thinker, talker, code2wav)" in err and "generating" in err
    assert got["text_token_ids"] == want.text_token_ids and got["codec_frames"] == 12
    audio, rate = sf.read(str(flac), dtype="int16")
    pcm = np.frombuffer(__import__("omni_ray.audio").audio.to_pcm16(want.audio), "<i2")
    assert rate == 24000 and audio.shape == pcm.shape
    assert np.abs(audio.astype(int) - pcm).max() <= 2  # libsndfile scales by 32768, we by 32767
    assert any("RANDOM weights" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)  # the tiny checkpoint is random: said once, as a warning
    # the config's default voice when --speaker is not given
    got, err = _run(capsys, ["generate", "--config", str(cfg), "--text", "Hello", "--json",
                             "--modalities", "text", "--progress"])
    assert f"loading {tiny_model_dir} (thinker) on cpu" in err
    assert got["text_token_ids"] == want.text_token_ids


@pytest.mark.parametrize("suffix", [".ogg", ".mp3", ".wav"])
def test_out_formats(tiny_model_dir, tmp_path, capsys, suffix):
    out = tmp_path / f"a{suffix}"
    got, _ = _run(capsys, ["generate", "--model", tiny_model_dir, "--text", "Hi", "--json",
                           "--max-tokens", "3", "--max-audio-frames", "8", "--out", str(out)])
    audio, rate = sf.read(str(out))
    assert rate == 24000 and got["audio_samples"] > 0
    assert abs(len(audio) - got["audio_samples"]) <= 2048  # mp3 pads its frames
    assert np.abs(audio).max() > 1e-3


def test_unknown_voice_names_the_checkpoints(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", tiny_model_dir, "--text", "a", "--speaker", "bob"])
    assert e.value.code == 2
    assert "unknown voice 'bob'; available: aiden, chelsie, ethan" in capsys.readouterr().err


def test_text_only_loads_the_thinker_alone(omni, tiny_model_dir):
    text_only = Omni(tiny_model_dir, mode="sync", audio=False)
    assert text_only.talker is None and text_only.code2wav is None
    req = OmniRequest(request_id="t", prompt_token_ids=omni.prompt_ids("Hi"), max_tokens=4,
                      modalities=("text",))
    assert text_only.generate(req)[0].text_token_ids == omni.generate(req)[0].text_token_ids
    with pytest.raises(ValueError, match="audio=False"):
        text_only.generate(req.model_copy(update={"modalities": ("text", "audio")}))
