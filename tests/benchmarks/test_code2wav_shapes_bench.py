"""``benchmarks/code2wav_shapes_bench.py`` on CPU, tiny vocoder: it runs, writes its report, and
its padded forwards meet no shape first and keep the audio (within float32 noise)."""

from __future__ import annotations

import json

from benchmarks import code2wav_shapes_bench


def test_code2wav_shapes_bench_runs_on_cpu(tmp_path):
    report = code2wav_shapes_bench.main(["--setup", "tiny", "--pairs", "3x5,2x17,33x30",
                                         "--max-batch", "4", "--repeat", "1",
                                         "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "code2wav_shapes_cpu.json").read_text())
    assert saved["sizes"] == [[1, 2, 4], [1, 2, 4, 8, 16, 25]] and saved["warm_up_s"] > 0
    got = {(r["batch"], r["frames"]): r for r in report["results"]}
    assert got[(3, 5)]["padded_new_shapes"] == got[(2, 17)]["padded_new_shapes"] == 0
    assert got[(33, 30)]["padded_new_shapes"] == 1  # past the largest batch and frames: as is
    for r in report["results"]:
        assert r["diff"] < 1e-5 and min(r["first_ms"], r["exact_ms"], r["padded_ms"]) > 0


def test_code2wav_shapes_bench_graphs_on_cpu(tmp_path):
    """``--graphs`` on CPU: the static forward runs eagerly (no capture); the pairs within the
    buckets replay it, and keep the audio."""
    report = code2wav_shapes_bench.main(["--setup", "tiny", "--pairs", "3x5,33x30", "--graphs",
                                         "--max-batch", "4", "--repeat", "2",
                                         "--out-dir", str(tmp_path)])
    assert report["graphs_ready"] == 3 * 6 and report["graphs_s"] > 0
    got = {(r["batch"], r["frames"]): r for r in report["results"]}
    assert got[(3, 5)]["graph_replays"] == 2 and got[(3, 5)]["graph_diff"] < 1e-5
    assert got[(33, 30)]["graph_replays"] == 0  # past the largest batch and frames: eager
