"""The two-talkers question's benchmark (benchmarks/code_predictor_side_by_side.py) runs its
plumbing on CPU: worker processes, the barrier per scenario, the layout comparison in the JSON.
Its numbers mean something on a GPU only."""

from __future__ import annotations

import json

import pytest

from benchmarks import code_predictor_side_by_side as bench

pytestmark = pytest.mark.slow


def test_alone_and_side_by_side_levels_reach_the_json(tmp_path):
    res = bench.main(["--device", "cpu", "--batches", "1,2", "--procs", "2", "--seconds", "0.5",
                      "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "code_predictor_side_by_side.json").read_text())
    assert saved["procs"] == 2 and not saved["mps"]
    for b in ("1", "2"):
        assert len(saved["alone"][b]["ms_per_frame"]) == 1
        assert len(saved["side_by_side"][b]["ms_per_frame"]) == 2
        for scenario in ("alone", "side_by_side"):  # every worker made frames and timed them
            lv = saved[scenario][b]
            assert all(n >= 1 for n in lv["frames"]) and all(ms > 0 for ms in lv["ms_per_frame"])
    # c=2: one process at batch 2 against two at batch 1
    assert res["layout"][2] == dict(one_talker_ms=res["alone"][2]["ms_per_frame"][0],
                                    split_ms=max(res["side_by_side"][1]["ms_per_frame"]))
    assert set(saved["layout"]) == {"2"}
