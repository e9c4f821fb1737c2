"""benchmarks/gpu_check.py: its comparison can fail, its config builds, and on CPU the whole check
(`serve run` subprocess, openai client, offline transformers pipeline) passes end to end."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root holds benchmarks/

from benchmarks import gpu_check  # noqa: E402
from benchmarks.answers import (  # noqa: E402
    BF16_MIN_EQUAL_TEXT_TOKENS,
    SAMPLES_PER_FRAME,
    WITHHELD_SAMPLES,
    compare_answers,
    well_formed,
)

LEVEL_KEYS = {"concurrency", "ttft_p50_s", "ttfa_p50_s", "ttfa_p99_s", "rtf_p50", "rtf_p99",
              "stall_p99_s", "realtime_frac", "text_tok_s", "audio_s_per_s", "num_requests",
              "text_rtf_p50"}


def words(s: str) -> list[str]:
    return s.split()


def answer(text: str, frames: int = 3, seed: int = 0) -> dict:
    n = frames * SAMPLES_PER_FRAME - WITHHELD_SAMPLES
    pcm = np.random.default_rng(seed).integers(-9000, 9000, n)
    return dict(text=text, pcm=pcm.astype("<i2"), finish="length")


# -- the comparison must be able to fail ---------------------------------------------------------
def test_equal_answers_pass_and_one_lsb_is_allowed():
    ref = answer("a b c d")
    got = dict(ref, pcm=(ref["pcm"].astype(int) + 1).astype("<i2"))
    c = compare_answers(ref, got, words, exact=True)
    assert c["ok"] and c["first_text_diff"] is None and c["first_frame_diff"] is None
    assert c["pcm_max_diff"] == 1


def test_a_different_text_fails_in_float32():
    c = compare_answers(answer("a b c d"), answer("a b x d"), words, exact=True)
    assert not c["ok"] and c["first_text_diff"] == 2


def test_different_audio_fails_in_float32_and_names_the_frame():
    ref = answer("a b", frames=3)
    pcm = ref["pcm"].copy()
    pcm[2 * SAMPLES_PER_FRAME + 5] += 2
    c = compare_answers(ref, dict(ref, pcm=pcm), words, exact=True)
    assert not c["ok"] and c["first_frame_diff"] == 2 and c["pcm_max_diff"] == 2
    shorter = compare_answers(ref, dict(ref, pcm=ref["pcm"][:SAMPLES_PER_FRAME]), words, True)
    assert not shorter["ok"] and shorter["first_frame_diff"] == 1


def test_bf16_allowance_is_a_text_prefix():
    n = BF16_MIN_EQUAL_TEXT_TOKENS
    ref = answer(" ".join(f"w{i}" for i in range(2 * n)))
    late = " ".join(f"w{i}" if i < n else "x" for i in range(2 * n))
    early = " ".join(f"w{i}" if i < n - 1 else "x" for i in range(2 * n))
    assert compare_answers(ref, answer(late, seed=1), words, exact=False)["ok"]
    c = compare_answers(ref, answer(early, seed=1), words, exact=False)
    assert not c["ok"] and c["first_text_diff"] == n - 1


def test_bf16_texts_may_part_sooner_only_where_the_reference_was_a_near_tie():
    """Parting before ``BF16_MIN_EQUAL_TEXT_TOKENS`` passes only at a token whose top-two margin
    in the offline answer was within its bf16 bound, and only when that answer's sampled ids
    are the text's tokens (else the index could point at another token)."""
    ref = answer("a b c d e f")
    got = answer("a b x d e f", seed=1)
    ids = words(ref["text"])
    margins = [(0.05, 0.004), (0.03, 0.004), (0.0003, 0.0038), (0.04, 0.004)]
    c = compare_answers(dict(ref, token_ids=ids, margins=margins), got, words, exact=False)
    assert c["ok"] and c["first_text_diff"] == 2 and c["ref_margin_at_diff"] == (0.0003, 0.0038)
    decided = [m if i != 2 else (0.01, 0.0038) for i, m in enumerate(margins)]
    c = compare_answers(dict(ref, token_ids=ids, margins=decided), got, words, exact=False)
    assert not c["ok"] and c["ref_margin_at_diff"] == (0.01, 0.0038)
    other_ids = [ids[0], "zz", *ids[2:]]  # sampled ids that re-tokenize otherwise
    c = compare_answers(dict(ref, token_ids=other_ids, margins=margins), got, words, exact=False)
    assert not c["ok"] and "ref_margin_at_diff" not in c
    assert not compare_answers(dict(ref, token_ids=ids, margins=margins), got, words,
                               exact=True)["ok"]  # float32: exact, no allowance


def test_well_formed_audio_is_whole_frames_within_the_limit():
    assert well_formed(answer("hi", frames=1), frames=3, audio=True)[0]
    assert well_formed(answer("hi", frames=3), frames=3, audio=True)[0]
    assert not well_formed(answer("hi", frames=4), frames=3, audio=True)[0]
    cut = answer("hi")
    cut["pcm"] = cut["pcm"][:-7]
    assert not well_formed(cut, frames=3, audio=True)[0]
    assert not well_formed(dict(text="", pcm=None, finish="stop"), frames=3, audio=False)[0]


def test_cpu_config_validates_and_drops_gpu_values():
    from omni_ray.config.serving import OmniServingArgs

    for tiny in (True, False):
        cfg = gpu_check.app_config("/tmp/none", "cpu", 1234, tiny=tiny, dummy=False,
                                   processor=True)
        args = cfg["applications"][0]["args"]
        OmniServingArgs(**args)
        assert cfg["http_options"] == {"host": "127.0.0.1", "port": 1234}
        for stage in ("thinker", "talker", "code2wav"):
            assert args[stage]["device"] == "cpu" and args[stage]["dtype"] == "float32"
            assert args[stage]["engine_resources"]["num_gpus"] == 0
        assert "gpu_memory_utilization" not in args["thinker"]["engine_kwargs"]
        assert ("default_sampling" in args["thinker"]) is not tiny  # tiny: greedy


def test_cuda_config_keeps_the_yaml_gpu_values():
    cfg = gpu_check.app_config("/tmp/none", "cuda", 1234, tiny=True, dummy=False, processor=False)
    args = cfg["applications"][0]["args"]
    assert args["thinker"]["device"] == "cuda" and args["thinker"]["dtype"] == "bfloat16"
    assert args["thinker"]["engine_resources"]["num_gpus"] > 0
    assert "enforce_eager" not in args["talker"]["engine_kwargs"]  # compiled on GPU
    assert args["thinker"]["engine_kwargs"]["limit_mm_per_prompt"]["audio"] == 0
    for stage in ("thinker", "talker"):  # every kernel JIT in traffic in the serve log
        assert args[stage]["engine_kwargs"]["jit_monitor_verbose"] is True
    cpu = gpu_check.app_config("/tmp/none", "cpu", 1234, tiny=True, dummy=False, processor=False)
    assert "jit_monitor_verbose" not in cpu["applications"][0]["args"]["talker"]["engine_kwargs"]


def test_the_kernel_jits_of_a_level_are_counted_from_the_serve_log(tmp_path):
    log = tmp_path / "serve.log"
    jit = ("(StageEngine pid=1) WARNING 12-05 17:41:45 [jit_monitor.py:135] Triton kernel JIT "
           "compilation during inference: {}. This causes a latency spike; consider extending "
           "warmup to cover this shape/config.\n")
    log.write_text(jit.format("fused_moe_kernel") + "INFO something else\n")
    mark = gpu_check._log_size(log)
    with open(log, "a") as f:  # what the level logged
        f.write(jit.format("fused_moe_kernel") + jit.format("fused_moe_kernel (BLOCK_M=64)")
                + jit.format("_topk_kernel") + "INFO a step\n")
    assert gpu_check.jit_lines(log, mark) == {"fused_moe_kernel": 2, "_topk_kernel": 1}
    assert gpu_check.jit_lines(log, 0)["fused_moe_kernel"] == 3
    assert gpu_check.jit_lines(None, 0) == {} and gpu_check.jit_lines(tmp_path / "no", 0) == {}


# -- end to end on CPU ---------------------------------------------------------------------------
def run_check(tmp_path: Path, *argv: str) -> tuple[int, list[str], dict]:
    rc = gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--restarts", "1", *argv])
    lines = (tmp_path / "gpu_check.txt").read_text().splitlines()
    return rc, lines, json.loads((tmp_path / "gpu_check.json").read_text())


def report(lines: list[str], data: dict) -> str:
    """The check's lines, then the log tail of each FAIL and retried start that kept one: the
    end of an assertion's message, the part CI's output keeps."""
    tails = [f"--- {c['status']} {c['name']}: the log's tail\n{c['log_tail']}"
             for c in data["checks"] if c["status"] in ("FAIL", "INFO") and c.get("log_tail")]
    return "\n".join(lines + tails)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_tiny_phase_passes_on_cpu(tmp_path):
    rc, lines, data = run_check(tmp_path, "--phases", "tiny")
    assert rc == 0, report(lines, data)
    assert all(line.startswith(("PASS", "SKIP", "INFO")) for line in lines), lines
    assert [line for line in lines if line.startswith("INFO")] == [  # where each start went
        line for line in lines if line.startswith("INFO tiny_start1 start phases: thinker ")]
    names = {c["name"] for c in data["checks"] if c["status"] == "PASS"}
    assert {"tiny start 1/1", "tiny text == offline cpu", "tiny audio-stream == offline cpu",
            "tiny audio-wav == offline cpu", "tiny speech-out == offline cpu",
            "tiny speech-in == offline cpu"} <= names
    assert len(data["commit"]) == 40 and isinstance(data["dirty"], bool)
    assert {"torch", "vllm", "ray"} <= set(data["versions"])
    assert lines[-1].startswith("PASS gpu_check:")


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_standin_phase_passes_on_cpu_and_writes_gpu_serve_json(tmp_path):
    rc, lines, data = run_check(tmp_path, "--phases", "standin,decode", "--num-requests", "2",
                             "--decode-variants", "inproc",
                             "--rates", "4", "--rate-requests", "3", "--rate-prompt-words", "8,300",
                             "--text-levels", "2", "--repeat-base",
                             "--ab", "urgent:pipeline.code2wav_urgent_ms=300,"
                             "code2wav.deployment_config.num_replicas=2,"
                             "code2wav.engine_resources.mps_low_priority=true",
                             "--ab", "pushone:pipeline.coalesce_pushes=false",
                             "--ab", "c2w30:code2wav.engine_resources.mps_sm_percent=30",
                             "--ab", "c2wlow:code2wav.engine_resources.mps_low_priority=true",
                             "--torch-profile", "2", "--torch-profile-text", "1")
    assert rc == 0, report(lines, data)
    prof = json.loads((tmp_path / "gpu_profile.json").read_text())  # every stage, under load
    assert prof["concurrency"] == 2 and set(prof["stages"]) == {"thinker", "talker", "code2wav"}
    assert all(p["steps"] > 0 and p["top_host"] for p in prof["stages"].values()), prof
    assert sum(line.startswith("PASS torch profile c=2 ") and " call sites " not in line
               for line in lines) == 3
    # the second capture, with Python stacks: where each stage's waits for the device are made
    assert set(prof["call_sites"]) == set(prof["stages"]), prof["call_sites"]
    assert all(p["steps"] > 0 and p["waits"] == [] for p in prof["call_sites"].values())
    assert sum(line.startswith("PASS torch profile c=2 call sites ") for line in lines) == 3
    prof = json.loads((tmp_path / "gpu_profile_text.json").read_text())  # the thinker alone
    assert prof["text_only"] and set(prof["stages"]) == {"thinker"}, prof
    (th,) = prof["stages"].values()
    assert th["steps"] > 0 and th["host_ms_per_step_total"] > 0 and th["top_host"]
    assert sum(line.startswith("PASS torch profile text c=1 thinker") for line in lines) == 1
    (phases,) = [line for line in lines if line.startswith("INFO standin start phases")]
    assert all(f"{stage} turn_wait " in phases for stage in ("thinker", "talker", "code2wav"))
    assert any(line.startswith("PASS standin /v1/models says dummy") for line in lines)
    # the engines run under the MPS share and priority their stage asks for (the yaml's thinker
    # at half the SMs; the variant's code2wav at low priority), as their environment says
    (mps,) = [line for line in lines if line.startswith("PASS standin engines' MPS settings")]
    assert "thinker {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '50'}" in mps, mps
    assert "talker none" in mps and "code2wav none" in mps, mps
    (mps,) = [line for line in lines
              if line.startswith("PASS standin urgent engines' MPS settings")]
    assert "code2wav {'CUDA_MPS_CLIENT_PRIORITY': '1'}" in mps, mps
    assert any(line.startswith("PASS standin speech-out well-formed") for line in lines)
    for name in ("gpu_serve.json", "gpu_serve_urgent.json"):  # the base, then the A/B variant
        serve = json.loads((tmp_path / name).read_text())
        assert {"commit", "device", "setup", "serve_run_to_healthy_s", "levels"} <= set(serve)
        assert [lv["concurrency"] for lv in serve["levels"]] == [1, 2]
        setup = serve["setup"]  # ignore_eos by default: every answer of the asked lengths
        assert setup["ignore_eos"] is True
        for lv in serve["levels"]:
            assert LEVEL_KEYS <= set(lv) and lv["num_ok"] == lv["num_requests"] == 2
            assert lv["output_tokens_mean"] == setup["max_tokens"]
            samples = round(lv["audio_seconds_mean"] * 24000)  # a frame: 1920 samples at 24 kHz
            assert -(-samples // 1920) == setup["max_audio_frames"], lv["audio_seconds_mean"]
            assert [r["t0_s"] for r in lv["requests"]] == sorted(r["t0_s"] for r in lv["requests"])
            assert len(lv["requests"]) == 2 and all(r["ttfa_s"] > 0 for r in lv["requests"])
            assert all(r["stall_s"] >= 0 for r in lv["requests"])
            # the talker speaks the text as it streams: the audio ends after the text does
            assert all(0 < r["text_rtf"] <= r["rtf"] for r in lv["requests"]), lv["requests"]
            assert all(r["stall_s"] == pytest.approx(sum(w for _, w in r["stalls"]), abs=1e-3)
                       for r in lv["requests"])  # where each stream waited, rounded
            assert list(lv["stall_where"])[0] == "<0.1s" and all(
                v["requests_frac"] is not None for v in lv["stall_where"].values())
            assert 0 <= lv["realtime_frac"] <= 1 and lv["stall_p99_s"] >= 0
            assert len(lv["ttfa_requests"]) == 2 and lv["ttfa_requests_missing"] == 0  # by id
            assert all(r["ingress first audio"] > 0 for r in lv["ttfa_requests"])
            tr = lv["step_trace"]  # the engines' step records (benchmarks/step_trace.py)
            assert all(tr[st]["steps"] > 0 for st in ("thinker", "talker", "code2wav")), tr
            assert sum(g["released"] for g in tr["talker_releases"]) == 2
            assert tr["talker_opening"] and tr["talker_opening"][-1]["emits"] > 0
            # code2wav's forwards of a first-seen (batch, frames) beside the others
            split = tr["code2wav"]["new_shapes"]
            assert split["new"]["steps"] + split["seen"]["steps"] > 0, split
        # each level (base and variant alike) after a warm-up burst of its own concurrency
        assert serve["setup"]["warmup_burst"] is True
        assert ("poisson" in serve) is (name == "gpu_serve.json")  # open loop: the base only
    assert serve["setup"]["pipeline"]["code2wav_urgent_ms"] == 300  # the variant's args
    # decode: plain vLLM on the thinker's backbone at the levels' batches, beside the app's step
    (fmt,) = json.loads((tmp_path / "thinker_decode.json").read_text())["formats"]
    assert fmt["quantization"] == "none" and set(fmt["levels"]) == {"1", "2"}
    assert any(line.startswith("PASS thinker decode alone none: b=1 ") for line in lines)
    # the plain engine again with its engine core in process, as the app's thinker runs it
    (inproc,) = [line for line in lines if line.startswith("PASS thinker decode alone inproc:")]
    assert "the whole GPU's)" in inproc and "in_process True" in inproc, inproc
    assert json.loads((tmp_path / "thinker_decode_inproc.json").read_text())["setup"][
        "in_process"] is True
    beside = [line for line in lines if line.startswith("INFO thinker in the app vs alone c=")]
    assert len(beside) == 2 and all("allows RTF >= " in line for line in beside), beside
    # text only: the thinker without the speech stages, beside the level with speech
    (text,) = [line for line in lines if line.startswith("PASS text only c=2: ")]
    assert "(with speech " in text and "no audio: True" in text, text
    (lv,) = json.loads((tmp_path / "gpu_serve.json").read_text())["text_only"]
    assert lv["num_ok"] == lv["num_requests"] == 2 and lv["text_tok_s_p50"] > 0
    assert lv["thinker_ms_per_step"] > 0 and not lv["audio_seconds_mean"]
    (lv,) = json.loads((tmp_path / "gpu_serve.json").read_text())["poisson"]
    assert lv["rate"] == 4 and lv["num_ok"] == lv["num_requests"] == 3
    assert [r["t0_s"] for r in lv["requests"]] == sorted(r["t0_s"] for r in lv["requests"])
    assert sorted(r["prompt_tokens"] for r in lv["requests"]) == sorted(lv["prompt_tokens"])
    assert all(r["ttfa_s"] > 0 for r in lv["requests"])
    assert lv["ttfa_p99_s"] >= lv["ttfa_p50_s"] > 0 and len(lv["prompt_tokens"]) == 3
    assert 0 <= lv["realtime_frac"] <= 1 and lv["stall_p99_s"] >= 0
    assert sum(line.startswith("INFO A/B urgent c=") for line in lines) == 2
    assert sum(line.startswith("INFO new shapes c=") for line in lines) == 2  # the base's
    # the variant's two code2wav replicas: both started before its bench, both in its phases
    start = data["phases"]["standin_ab"]["urgent"]["start"]
    assert {"code2wav", "code2wav#2"} <= set(start["start_phases"]), start
    assert start["all_engines_s"] >= start["healthy_s"] > 0
    assert sum(line.startswith("INFO stalls by audio played urgent c=") for line in lines) == 2
    for name in ("slowest steps", "talker first chunks by step", "talker opening burst"):
        assert sum(line.startswith(f"INFO {name} c=") for line in lines) == 2, name
    # a live variant (config/pipeline.LIVE_FIELDS): on the base's engines, without a restart
    assert any(line.startswith("PASS standin pushone live") for line in lines), lines
    assert "start" not in data["phases"]["standin_ab"]["pushone"]
    assert data["phases"]["standin_ab"]["pushone"]["live"] is True
    assert sum(line.startswith("INFO A/B pushone c=") for line in lines) == 2
    # --repeat-base: the base's config benched again right after it, on the same engines, and
    # its numbers beside every variant's (a change smaller than the base's own means nothing)
    again = json.loads((tmp_path / "gpu_serve_again.json").read_text())["levels"]
    assert [lv["concurrency"] for lv in again] == [1, 2]
    assert all(lv["num_ok"] == lv["num_requests"] == 2 for lv in again)
    assert data["phases"]["standin_ab"]["again"]["overrides"] == {}
    assert sum(line.startswith("INFO A/B again c=") for line in lines) == 2
    for name in ("urgent", "pushone", "c2w30", "c2wlow"):
        ab = [line for line in lines if line.startswith(f"INFO A/B {name} c=")]
        assert len(ab) == 2 and all(line.count(" (again ") == 7 for line in ab), ab
    for lv in json.loads((tmp_path / "gpu_serve_pushone.json").read_text())["levels"]:
        talker = lv["step_profile"]["talker"]  # the change took: one call a chunk
        assert talker["pushes_in"] == talker["chunks_in"] > 0, talker
        assert lv["num_ok"] == lv["num_requests"] == 2
    # MPS-share variants: on the base's app, only the stages they change get new engines (the
    # thinker and talker keep theirs), and a setting an earlier variant changed goes back to the
    # base's (the same for a stage: engines of every stage changed so far are sent)
    ab = data["phases"]["standin_ab"]
    assert "start" not in ab["c2w30"] and "start" not in ab["c2wlow"]
    for name in ("c2w30", "c2wlow"):
        assert set(ab[name]["engines"]) == {"code2wav"}
        (seconds,) = ab[name]["engines_renewed_s"]["code2wav"]  # one replica, one new engine
        assert seconds > 0
    assert ab["c2wlow"]["engines"]["code2wav"] == {"mps_sm_percent": None,
                                                   "mps_low_priority": True}
    (mps,) = [line for line in lines if line.startswith("PASS standin c2w30 engines' MPS")]
    assert "code2wav {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '30'}" in mps, mps
    assert "thinker {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '50'}" in mps, mps
    (mps,) = [line for line in lines if line.startswith("PASS standin c2wlow engines' MPS")]
    assert "code2wav {'CUDA_MPS_CLIENT_PRIORITY': '1'}" in mps, mps
    for name in ("c2w30", "c2wlow"):
        assert sum(line.startswith(f"INFO A/B {name} c=") for line in lines) == 2
        levels = json.loads((tmp_path / f"gpu_serve_{name}.json").read_text())["levels"]
        assert all(lv["num_ok"] == lv["num_requests"] == 2 for lv in levels)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_code2wav_and_batch_phases_pass_on_cpu(tmp_path):
    """The code2wav step's batched A/B (and its float32 equality), then ``omni-ray batch`` on the
    stand-in with the app's engines: every row once, without error, timed per stage."""
    rc, lines, data = run_check(tmp_path, "--phases", "code2wav,batch")
    assert rc == 0, report(lines, data)
    assert any(line.startswith("PASS code2wav batched == one by one (cpu fp32)") for line in lines)
    rep = json.loads((tmp_path / "code2wav_batch_cpu.json").read_text())
    assert [r["requests"] for r in rep["results"]] == [1, 4]
    assert all(r["max_abs_diff_rel_peak"] < 1e-4 for r in rep["results"])
    assert any(line.startswith("PASS batch job rows: 8/8 rows, 0 errors, 0 duplicates")
               for line in lines), "\n".join(lines)
    batch = json.loads((tmp_path / "batch_cpu_check.json").read_text())
    assert batch["summary"]["rows"] == 8 and batch["setup"]["batch_size"] == 2
    assert batch["files"] >= 2 and batch["rows_per_s_after_first_file"] > 0
    assert all(v > 0 for v in batch["stage_busy_s"].values())
    assert batch["serve_top_level"] is None  # no standin phase ran: nothing to set beside


def test_repeat_base_keeps_its_name():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--repeat-base", "--ab", "again:pipeline.coalesce_pushes=false"])
    assert gpu_check.parse_args(["--ab", "again:pipeline.coalesce_pushes=false"]).ab


def test_decode_variants_are_an_sm_cap_in_process_or_both_and_others_are_refused():
    assert gpu_check.parse_decode_variant("sm50") == ["--sm-percent", "50"]
    assert gpu_check.parse_decode_variant("inproc") == ["--in-process"]
    assert gpu_check.parse_decode_variant("sm70+inproc") == ["--sm-percent", "70", "--in-process"]
    for bad in ("sm0", "sm101", "fast", "sm50+"):
        with pytest.raises(ValueError, match="decode variant"):
            gpu_check.parse_decode_variant(bad)
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--decode-variants", "sm50,fast"])


def test_targets_say_met_only_within_the_target():
    levels = [dict(concurrency=1, ttfa_p50_s=0.15, rtf_p50=0.2),
              dict(concurrency=32, ttfa_p50_s=0.5, rtf_p50=0.25, rtf_p99=1.0,
                   realtime_frac=63 / 64)]
    got = {t["name"]: t["met"] for t in gpu_check.targets(levels)}
    assert got == {"c=1 ttfa_p50_s <= 0.15": True, "c=1 rtf_p50 <= 0.15": False,
                   "c=32 ttfa_p50_s <= 0.6": True, "c=32 rtf_p50 <= 0.25": True,
                   "c=32 rtf_p99 < 1.0": False,
                   "c=32 realtime_frac == 1.0": False}  # c=8 not run: left out
    levels[1].update(rtf_p99=1.46, realtime_frac=1.0)  # a few late short answers, none stalls
    got = {t["name"]: t["met"] for t in gpu_check.targets(levels)}
    assert got["c=32 realtime_frac == 1.0"] is True and got["c=32 rtf_p99 < 1.0"] is False


def test_a_variant_sets_dotted_app_args_and_keeps_the_base():
    name, over = gpu_check.parse_variant("fifo:pipeline.first_chunks_first=false,"
                                         "talker.max_num_seqs=8")
    assert name == "fifo" and over == {"pipeline.first_chunks_first": False,
                                       "talker.max_num_seqs": 8}
    base = gpu_check.app_config("/tmp/none", "cuda", 1234, tiny=False, dummy=True, processor=True)
    cfg = gpu_check.with_overrides(base, over)
    args = cfg["applications"][0]["args"]
    assert args["pipeline"]["first_chunks_first"] is False and args["talker"]["max_num_seqs"] == 8
    assert "first_chunks_first" not in base["applications"][0]["args"]["pipeline"]  # untouched
    for bad in ("ramp", "ramp:", ":a=1", "ramp:a"):
        with pytest.raises(argparse.ArgumentTypeError):
            gpu_check.parse_variant(bad)


def test_a_start_whose_serve_run_exits_says_why_and_is_made_once_more(tmp_path):
    """``serve run`` itself exiting (CI once: a bare "exited with 1" on a variant's start right
    after the base's stop, its log gone with the run) is retried once on a fresh Ray cluster,
    with an INFO line; the error names the exit status and the log's error line. Here the
    config is one ``serve run`` refuses, so both tries exit."""
    args = gpu_check.parse_args(["--device", "cpu", "--out", str(tmp_path)])
    chk = gpu_check.Check(args)
    cfg = {"http_options": {"port": "no-port"},
           "applications": [{"name": "omni", "import_path": "omni_ray.builders:app"}]}
    sr, st = gpu_check.timed_start(chk, cfg, "bad", "http://127.0.0.1:9", ray_stop=False)
    assert sr is None and st["retried"] is True
    assert st["error"].startswith("ServeExited: `serve run` exited with 1: "), st
    assert "ValidationError" in st["error"], st
    (retried,) = chk.checks
    assert retried["status"] == "INFO" and retried["name"] == "bad start retried"
    assert "no-port" in retried["log_tail"]
    logs = tmp_path / "logs"
    assert (logs / "bad.log").exists() and (logs / "bad_retry.log").exists()


def test_serve_run_is_launched_once(tmp_path):
    """``with`` on a run already started must not launch a second app (seen on the H200: two
    apps of real size on one GPU, the second truncating the first's log)."""
    from benchmarks.serve_proc import ServeRun

    sr = ServeRun(tmp_path / "missing.yaml", tmp_path / "serve.log")
    sr.__enter__()
    first = sr.proc
    with sr:
        assert sr.proc is first
    assert first.poll() is not None  # stopped on exit


@pytest.mark.slow
def test_a_deploy_serve_gives_up_on_ends_the_wait_at_once(tmp_path):
    """An app that cannot even be imported: Serve logs that the deploy failed and ``serve run``
    keeps running; the wait must end there with the exception, not at its timeout (on the
    H200 a missing module once held the check for its whole 10-minute wait)."""
    import time

    from benchmarks.launch import free_port
    from benchmarks.serve_proc import ServeRun

    port = free_port()
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(f"http_options: {{host: 127.0.0.1, port: {port}}}\napplications:\n"
                   "  - name: broken\n    route_prefix: /\n"
                   "    import_path: omni_ray_no_such_module:app\n")
    with ServeRun(cfg, tmp_path / "serve.log", env={"OMP_NUM_THREADS": "1"}) as sr:
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="could not deploy.*No module named "
                                               "'omni_ray_no_such_module'"):
            sr.wait_healthy(f"http://127.0.0.1:{port}", 300)
        assert time.perf_counter() - t0 < 240


def test_a_check_whose_app_cannot_import_stops_before_starting_anything(tmp_path, monkeypatch):
    """A package the ingress imports is missing (webrtcvad on the H200 once): one FAIL line and
    exit 1 in seconds, no Ray started, no phase run."""
    import builtins

    real_import = builtins.__import__

    def no_vad(name, *args, **kwargs):
        if name == "webrtcvad":
            raise ModuleNotFoundError("No module named 'webrtcvad'")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m.startswith("omni_ray.ingress") or m == "webrtcvad"]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_vad)
    threads = torch.get_num_threads()
    rc = gpu_check.main(["--device", "cpu", "--phases", "tiny", "--out", str(tmp_path)])
    assert torch.get_num_threads() == threads  # nothing of the CPU set-up ran either
    lines = (tmp_path / "gpu_check.txt").read_text().splitlines()
    assert rc == 1
    assert lines[0] == ("FAIL preflight: the app's modules import: ModuleNotFoundError: No module "
                        "named 'webrtcvad'")
    assert not (tmp_path / "logs").exists()  # no serve run was started


def test_a_base_under_mps_is_refused_where_there_is_no_mps(tmp_path):
    """``--standin-set mps=true`` runs the base under an MPS daemon: on a machine without one
    (this CPU box) that start fails as one FAIL line naming the daemon, before any app starts,
    and no variant runs without its base."""
    rc = gpu_check.main(["--device", "cpu", "--phases", "standin", "--out", str(tmp_path),
                         "--standin-set", "mps=true", "--ab", "b:pipeline.ramp_ratio=2"])
    lines = (tmp_path / "gpu_check.txt").read_text().splitlines()
    assert rc == 1
    fails = [line for line in lines if line.startswith("FAIL")]
    from omni_ray.mps import CONTROL

    assert fails[:-1] == [f"FAIL standin base MPS daemon: RuntimeError: {CONTROL} "
                          "not found: MPS is not available on this machine (it comes with the "
                          "NVIDIA driver on GPU nodes)"], lines
    assert fails[-1].startswith("FAIL gpu_check: 0 passed, 1 failed")
    assert not (tmp_path / "logs").exists() and not any("A/B" in line for line in lines)
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["phases"]["standin"]["mps"] is True


@pytest.mark.parametrize("base_mps,variant,expect", [
    (True, {}, True), (True, {"mps": False}, False), (False, {}, False),
    (False, {"mps": True}, True)])
def test_a_variant_runs_under_mps_as_its_base_unless_it_says(monkeypatch, tmp_path, base_mps,
                                                            variant, expect):
    args = gpu_check.parse_args(["--device", "cpu", "--out", str(tmp_path)])
    chk = gpu_check.Check(args)
    chk.base_mps = base_mps
    asked = []

    def no_daemon(chk, stack, tag):  # where MPS is asked for: record it, the start is refused
        asked.append(tag)
        return None

    def no_start(*a, **k):
        raise AssertionError("a variant whose MPS daemon failed must not start")

    monkeypatch.setattr(gpu_check, "mps_env", no_daemon)
    monkeypatch.setattr(gpu_check, "timed_start", no_start if expect else
                        lambda *a, **k: (None, dict(error="not started", log_tail="")))
    base = gpu_check.app_config("/tmp/none", "cpu", 1234, tiny=False, dummy=True, processor=True)
    gpu_check.standin_variant(chk, base, "v", {"pipeline.ramp_ratio": 2, **variant}, [])
    assert asked == (["v"] if expect else [])
    assert chk.data["phases"]["standin_ab"]["v"]["mps"] is expect
