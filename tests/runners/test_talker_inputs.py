"""``TalkerInputs.trailing_batch``: each row's text part of the next decode step, gathered for the
whole batch at once, equals bitwise the rows taken one by one from the same projection."""

from __future__ import annotations

import pytest
import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.runners.transformers.talker_inputs import ASSISTANT_HEADER, TalkerSeq


@pytest.fixture(scope="module")
def inputs(tiny_model_dir):
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.runners.factory import make_runner, stage_config

    return make_runner("talker", tiny_model_dir, stage_config("talker"),
                       pipeline=PipelineConfig()).inputs


def seq(i: int, text: int, step: int, finished: bool) -> TalkerSeq:
    """A request whose assistant stream has ``text`` ids after the header (plus the end token
    once ``finished``), at decode step ``step``."""
    s = TalkerSeq(f"r{i}", 0, SamplingParams(), 50, None)
    s.prompt_ids, s.assistant_start = [1, 2, 3] + [7, 8, 9], 3  # header: 3 ids
    s.text_ids = [100 + 17 * i + j for j in range(text)] + ([151645] if finished else [])
    s.text_finished, s.gen_step = finished, step
    return s


def one_by_one(inputs, seqs) -> torch.Tensor:
    """The rows as they were built before: one projection of the text ids, a slice per row."""
    rows, ids = [], []
    for s in seqs:
        a, k = s.stream, s.gen_step
        if ASSISTANT_HEADER + 1 + k < len(a) - 1 or not s.text_finished:
            rows.append(len(ids))
            ids.append(a[ASSISTANT_HEADER + 1 + k])
        else:
            last = max(len(a) - 2 - ASSISTANT_HEADER, 0)
            rows.append(inputs.tts_eos if k == last else inputs.tts_pad)
    proj = inputs.project_text(ids)[0] if ids else None
    return torch.cat([r if isinstance(r, torch.Tensor) else proj[r:r + 1].unsqueeze(0)
                      for r in rows])


def mixed(n: int) -> list[TalkerSeq]:
    """Rows of every kind, interleaved: text (streaming, or finished with text left), the
    step speaking tts_eos, and tts_pad after it."""
    kinds = [(6, 1, False), (4, 3, True), (4, 3, True), (3, 7, True), (5, 0, False)]
    out = []
    for i in range(n):
        text, step, fin = kinds[i % len(kinds)]
        out.append(seq(i, text, step if (text, step, fin) != (4, 3, True) or i % 2 else 2, fin))
    return out


@pytest.mark.parametrize("make", [
    lambda: mixed(5), lambda: mixed(32), lambda: [seq(i, 5, 1, False) for i in range(4)],
    lambda: [seq(i, 2, 9, True) for i in range(3)], lambda: [seq(0, 3, 2, True)],
    lambda: [seq(0, 3, 1, True)], lambda: [seq(0, 3, 2, True), seq(1, 2, 9, True)]],
    ids=["mixed5", "mixed32", "text", "pad", "eos", "one-text", "eos-pad"])
def test_trailing_batch_equals_the_rows_one_by_one(inputs, make):
    seqs = make()
    with torch.inference_mode():
        got, want = inputs.trailing_batch(seqs), one_by_one(inputs, seqs)
    assert got.shape == want.shape == (len(seqs), 1, inputs.tts_pad.shape[-1])
    assert torch.equal(got, want)


def test_warm_up_reports_where_the_graphs_time_went(inputs, monkeypatch, caplog):
    """The start phases get the code predictor's runs and captures, and the log says how the
    compile cache did (the CUDA graphs themselves: test_code_predictor_graph.py on CUDA)."""
    import logging

    assert inputs.warm_up(4) == {}  # CPU: no graphs, nothing to report

    class Graphs:  # CodePredictorGraphs' warm-up interface, without CUDA
        timing = dict(runs_s=0.0, captures_s=0.0, graphs=0)

        def warm_up(self, max_batch, sample):
            self.timing = dict(runs_s=self.timing["runs_s"] + 1.5,
                               captures_s=self.timing["captures_s"] + 0.25,
                               graphs=self.timing["graphs"] + 3)

    from torch._dynamo.utils import counters

    counters["inductor"]["fxgraph_cache_hit"] += 0  # an earlier compile in this process left keys
    monkeypatch.setattr(inputs, "cp_graphs", Graphs())
    with caplog.at_level(logging.INFO, logger="omni_ray"):
        parts = inputs.warm_up(4)
    assert parts == dict(code_predictor_runs_s=3.0, code_predictor_captures_s=0.5)
    assert "code predictor graphs: 6 captured; runs before them 3.0 s" in caplog.text
    assert "inductor cache unused" in caplog.text
