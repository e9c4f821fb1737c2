"""``omni-ray`` CLI: make-tiny, generate (in-process through ``main`` and once as a subprocess)."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from omni_ray import constants
from omni_ray.cli import main
from omni_ray.config.request import OmniRequest
from omni_ray.offline import Omni

FIELDS = {"text", "text_token_ids", "codec_frames", "audio_samples", "sample_rate", "finish_reason",
          "audio_seconds", "time_to_first_token", "time_to_first_audio", "latency", "mode"}


@pytest.fixture(scope="module")
def omni(tiny_model_dir) -> Omni:
    return Omni(tiny_model_dir, mode="sync")


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _expected(omni: Omni, text: str, **fields):
    req = OmniRequest(request_id="cli", prompt_token_ids=omni.prompt_ids(text), **fields)
    return omni.generate(req)[0]


def _check_summary(got: dict, out) -> None:
    assert FIELDS <= set(got)
    assert got["text"] == out.text
    assert got["text_token_ids"] == out.text_token_ids
    assert got["finish_reason"] == out.finish_reason.name.lower()
    assert got["codec_frames"] == out.codec_frames.shape[0]
    assert got["audio_samples"] == out.audio.numel()
    assert got["sample_rate"] == 24000
    assert got["audio_seconds"] == pytest.approx(out.audio.numel() / 24000)


def test_generate_json_npy_equals_offline(omni, tiny_model_dir, tmp_path, capsys):
    npy = tmp_path / "a.npy"
    got = _json(capsys, ["generate", "--model", tiny_model_dir, "--text", "Hello there",
                         "--mode", "sync", "--speaker", "chelsie", "--max-tokens", "6",
                         "--max-audio-frames", "20", "--json", "--out", str(npy)])
    out = _expected(omni, "Hello there", speaker="chelsie", max_tokens=6, max_audio_frames=20)
    _check_summary(got, out)
    assert got["mode"] == "sync" and got["codec_frames"] > 0 and got["out"] == str(npy)
    assert_same_audio(np.load(npy), out.audio.numpy())


def test_generate_human_summary_and_wav(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "a.wav"
    assert main(["generate", "--model", tiny_model_dir, "--text", "Hi", "--max-tokens", "4",
                 "--max-audio-frames", "12", "--code2wav-mode", "stateful", "--out",
                 str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("text: ") and "codec frames" in printed and "async_chunk" in printed
    assert f"wrote {path}" in printed
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == 12 * 1920 - 555


def test_generate_text_only(omni, tiny_model_dir, capsys):
    got = _json(capsys, ["generate", "--model", tiny_model_dir, "--text", "Hello there",
                         "--modalities", "text", "--max-tokens", "5", "--json"])
    out = _expected(omni, "Hello there", max_tokens=5, modalities=("text",))
    _check_summary(got, out)
    assert got["codec_frames"] == got["audio_samples"] == 0 and got["time_to_first_audio"] is None


def test_generate_prompt_ids(omni, tiny_model_dir, capsys):
    ids = omni.prompt_ids("Hello there", system="Be brief.")
    got = _json(capsys, ["generate", "--model", tiny_model_dir, "--prompt-ids",
                         ",".join(map(str, ids)), "--mode", "sync", "--max-tokens", "4",
                         "--max-audio-frames", "6", "--json"])
    req = OmniRequest(request_id="x", prompt_token_ids=ids, max_tokens=4, max_audio_frames=6)
    _check_summary(got, omni.generate(req)[0])
    assert got["prompt_tokens"] == len(ids)


def test_sample_is_seeded(omni, tiny_model_dir, tmp_path, capsys):
    def run(seed: str | None):
        out = tmp_path / f"{seed}.npy"
        seeded = ["--seed", seed] if seed is not None else []
        got = _json(capsys, ["generate", "--model", tiny_model_dir, "--text", "Hi", "--sample",
                             *seeded, "--max-tokens", "6", "--max-audio-frames", "5", "--json",
                             "--out", str(out)])
        return got, np.load(out)

    (a, wav_a), (b, wav_b), (c, _) = run("3"), run("3"), run(None)
    assert a["text_token_ids"] == b["text_token_ids"] and wav_a.shape == wav_b.shape
    assert_same_audio(wav_a, wav_b)
    assert a["text_token_ids"] != c["text_token_ids"]  # --seed defaults to 0
    greedy = _expected(omni, "Hi", max_tokens=6, max_audio_frames=5)
    assert a["text_token_ids"] != greedy.text_token_ids


def test_generate_with_audio_and_image_input(omni, tiny_model_dir, tmp_path, capsys):
    from media_samples import audio_bytes, image_bytes, picture, tone

    from omni_ray.inputs.audio import decode_audio

    clip, img = tmp_path / "q.mp3", tmp_path / "p.png"
    clip.write_bytes(audio_bytes(tone(1.0), 24000, "mp3"))
    img.write_bytes(image_bytes(picture()))
    got = _json(capsys, ["generate", "--model", tiny_model_dir, "--text", "What is this?",
                         "--audio", str(clip), "--image", str(img), "--mode", "sync",
                         "--max-tokens", "6", "--max-audio-frames", "20", "--json"])
    req = omni.request([{"role": "user", "content": [
        {"type": "audio", "audio": decode_audio(clip.read_bytes(), "mp3", max_seconds=10)},
        {"type": "image", "image": picture()}, {"type": "text", "text": "What is this?"}]}],
        request_id="cli", max_tokens=6, max_audio_frames=20)
    _check_summary(got, omni.generate(req)[0])
    assert got["prompt_tokens"] == len(req.prompt_token_ids) > 20  # placeholders expanded


def test_make_tiny_is_the_seeded_checkpoint(tiny_model_dir, tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "tiny")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "tiny")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "processor_config.json",
                 "chat_template.jinja", "tokenizer_config.json"):
        assert filecmp.cmp(tmp_path / "tiny" / name, Path(tiny_model_dir) / name, shallow=False)


def test_default_model_lives_in_omni_ray_home(omni, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "OMNI_RAY_HOME", tmp_path)
    (tmp_path / constants.TINY_MODEL_NAME).symlink_to(tiny_model_dir)
    got = _json(capsys, ["generate", "--text", "Hello there", "--modalities", "text",
                         "--max-tokens", "3", "--json"])
    assert got["model"] == str(tmp_path / "qwen3-omni-tiny")
    assert got["text_token_ids"] == _expected(omni, "Hello there", max_tokens=3,
                                              modalities=("text",)).text_token_ids


def test_default_model_is_made_on_first_use(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "OMNI_RAY_HOME", tmp_path / "home")
    got = _json(capsys, ["generate", "--text", "Hi", "--modalities", "text", "--max-tokens", "2",
                         "--json"])
    made = tmp_path / "home" / "qwen3-omni-tiny"
    assert got["model"] == str(made)
    assert filecmp.cmp(made / "model.safetensors", Path(tiny_model_dir) / "model.safetensors",
                       shallow=False)


def test_subprocess(omni, tiny_model_dir, tmp_path):
    exe = Path(sys.executable).parent / "omni-ray"
    if not exe.exists():
        pytest.skip(f"{exe} is not installed (pip install -e .)")
    npy, wav = tmp_path / "a.npy", tmp_path / "a.wav"
    common = ["generate", "--model", tiny_model_dir, "--text", "Tell me a story.", "--mode",
              "sync", "--speaker", "aiden", "--max-tokens", "5", "--max-audio-frames", "15",
              "--json"]
    env = dict(os.environ, OMNI_RAY_HOME=str(tmp_path / "home"))
    proc = subprocess.run([str(exe), *common, "--out", str(npy)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)  # stdout is exactly one JSON object
    out = _expected(omni, "Tell me a story.", speaker="aiden", max_tokens=5, max_audio_frames=15)
    _check_summary(got, out)
    assert_same_audio(np.load(npy), out.audio.numpy())
    assert not (tmp_path / "home").exists()  # --model given: the default model is not made

    bad = subprocess.run([str(exe), "generate", "--text", "a", "--mode", "fast"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


BAD_ARGS = {
    "no command": [],
    "no prompt": ["generate"],
    "two prompts": ["generate", "--text", "a", "--prompt-ids", "1"],
    "mode": ["generate", "--text", "a", "--mode", "fast"],
    "max tokens": ["generate", "--text", "a", "--max-tokens", "0"],
    "max frames": ["generate", "--text", "a", "--max-audio-frames", "-3"],
    "prompt ids": ["generate", "--prompt-ids", "1,x"],
    "system with ids": ["generate", "--prompt-ids", "1,2", "--system", "s"],
    "modality": ["generate", "--text", "a", "--modalities", "video"],
    "out suffix": ["generate", "--text", "a", "--out", "a.aac"],
    "config file": ["generate", "--text", "a", "--config", "no-such.yaml"],
    "out without audio": ["generate", "--text", "a", "--modalities", "text", "--out", "a.wav"],
    "code2wav mode": ["generate", "--text", "a", "--code2wav-mode", "magic"],
}


@pytest.mark.parametrize("argv", list(BAD_ARGS.values()), ids=list(BAD_ARGS))
def test_bad_args_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_missing_model_dir_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(tmp_path / "nope"), "--text", "a"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"no checkpoint directory at '{tmp_path / 'nope'}'" in err


@pytest.mark.parametrize("ids, message", [("1,2,3", "assistant"), ("151644,999999999", "vocab")])
def test_unservable_prompt_ids_exit_2(tiny_model_dir, capsys, ids, message):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", tiny_model_dir, "--prompt-ids", ids, "--max-tokens", "2"])
    assert e.value.code == 2 and message in capsys.readouterr().err


def assert_same_audio(a, b):
    """Same length; equal within 1e-5 of the peak (separate processes may pick other float
    kernels for the stateful vocoder, which moves the last bits)."""
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-12)


def test_generate_defaults_are_the_apps():
    """`omni-ray generate` takes what the Serve app would (issue 19, 22): no flag, no file -> the
    app's defaults; a flag -> the flag."""
    from omni_ray.cli import build_parser
    from omni_ray.cli.serve_config import serving_args
    from omni_ray.config.serving import OmniServingArgs

    args = build_parser().parse_args(["generate", "--text", "a"])
    got, _ = serving_args(args)
    app = OmniServingArgs()
    assert got.pipeline == app.pipeline and got.pipeline.code2wav_mode == "stateful"
    assert (got.default_speaker, got.limits) == (app.default_speaker, app.limits)
    assert (got.thinker.backend, got.thinker.device, got.thinker.dtype) == ("transformers", "cpu",
                                                                             "float32")
    args = build_parser().parse_args(["generate", "--text", "a", "--device", "cuda:1", "--dtype",
                                      "bfloat16", "--talker-backend", "vllm"])
    got, _ = serving_args(args)
    assert {s.device for s in (got.thinker, got.talker, got.code2wav)} == {"cuda:1"}
    assert {s.dtype for s in (got.thinker, got.talker, got.code2wav)} == {"bfloat16"}
    assert (got.thinker.backend, got.talker.backend) == ("transformers", "vllm")
