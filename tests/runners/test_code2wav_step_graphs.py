"""Code2wav's padded forwards replayed as CUDA graphs (code2wav_step_graphs.py).

On CPU, ``StepGraphs(capture=False)`` runs the forward eagerly on the same static buffers, with
the same copies in and out and the same cut of each row's window by a gather on a device tensor
of lengths: every part but the capture. A stream through it must give each request the audio and
state of the plain per-request forward, within float noise (TOL); on CUDA the captured graphs
likewise, within CUDA's float32 convolutions (TF32).
"""

from __future__ import annotations

import pytest
import torch

from code2wav_helpers import (SAMPLES_PER_FRAME, TINY_SLIDING, TOL, build_stream, decode_steps,
                              joined, one_shot, random_codes, rel_err)

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.runners.transformers.code2wav_shapes import ShapeBuckets
from omni_ray.runners.transformers.code2wav_step_graphs import StaticRows, StepGraphs
from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav

BATCHES, FRAMES = (1, 2, 4), (1, 2, 4, 8, 16, 25)
# per step, each request's new frames (0: nothing this step). The first step is every request's
# first call (eager); (25, 30, 0) has a chunk longer than every bucket (eager, unpadded); the
# step where request 2 starts late has a first call among carried rows (eager); the rest replay.
STEPS = [(2, 2, 0), (2, 2, 0), (4, 3, 2), (8, 5, 7), (16, 25, 1), (25, 30, 0), (3, 0, 9),
         (1, 1, 1)]
REPLAYED = 5  # steps 2, 4, 5, 7, 8: padded, every row past its first call


def _graphed(model, capture: bool) -> StreamingCode2Wav:
    stream = StreamingCode2Wav(model)
    stream.buckets = ShapeBuckets(stream, BATCHES, FRAMES)
    stream.buckets.warm_up()
    stream.step_graphs = StepGraphs(stream, BATCHES, FRAMES, capture=capture)
    stream.step_graphs.warm_up()
    return stream


@pytest.fixture(scope="module")
def model():
    return build_stream(TINY_SLIDING).model


def test_static_rows_give_each_request_its_own_audio_and_state(model):
    plain, graphed = StreamingCode2Wav(model), _graphed(model, capture=False)
    steps = graphed.step_graphs
    assert steps.ready == len(BATCHES) * len(FRAMES)  # each pair checked against the eager one
    codes = [random_codes(90, seed=50 + i) for i in range(3)]
    want, want_states, pos = decode_steps(plain, codes, STEPS)
    got, got_states, _ = decode_steps(graphed, codes, STEPS)
    assert steps.calls == REPLAYED
    for w_step, g_step in zip(want, got):
        for w, g in zip(w_step, g_step):
            assert w.shape == g.shape and rel_err(g, w) < TOL
    for w, g, c, n in zip(want_states, got_states, codes, pos):
        assert (g.frames_in, g.samples_out) == (w.frames_in, w.samples_out)
        for a, b in zip([*g.keys, *g.values, *g.conv_tails.values(), *g.trans_tails.values()],
                        [*w.keys, *w.values, *w.conv_tails.values(), *w.trans_tails.values()]):
            assert a.shape == b.shape
            assert a.numel() == 0 or (a - b).abs().max() <= TOL * max(b.abs().max(), 1e-3)
        # the carried state goes on to the plain stream's audio
        assert rel_err(graphed.decode(g, c[n:]), plain.decode(w, c[n:])) < TOL
    for c, n, audio in zip(codes, pos, joined(got, codes, STEPS)):
        assert rel_err(audio, one_shot(plain, c[:n])) < TOL


def test_a_replay_leaves_no_row_tied_to_the_buffers(model):
    """The states and samples a step returns are copies: the next step (which rewrites the
    static buffers) changes neither."""
    stream = _graphed(model, capture=False)
    codes = [random_codes(12, seed=60 + i) for i in range(2)]
    states = [stream.new_state() for _ in codes]
    stream.decode_batch(states, [c[:2] for c in codes])  # first calls: eager
    out = stream.decode_batch(states, [c[2:5] for c in codes])
    assert stream.step_graphs.calls == 1
    kept = [o.clone() for o in out]
    keys = [s.keys[0].clone() for s in states]
    other = [stream.new_state() for _ in range(4)]
    stream.decode_batch(other, [random_codes(1, seed=70 + i) for i in range(4)])
    stream.decode_batch(other, [random_codes(4, seed=80 + i) for i in range(4)])
    assert stream.step_graphs.calls == 2
    assert all(torch.equal(a, b) for a, b in zip(out, kept))
    assert all(torch.equal(s.keys[0], k) for s, k in zip(states, keys))
    assert [o.numel() for o in out] == [3 * SAMPLES_PER_FRAME] * 2


def test_a_pair_whose_check_fails_stays_eager(model, monkeypatch, caplog):
    """A replay that differs from the eager forward is never used: that pair stays eager."""
    stream = StreamingCode2Wav(model)
    stream.step_graphs = steps = StepGraphs(stream, (1, 2), (4,), capture=False)
    real_run = stream.run

    def wrong_for_two_rows(rows, codes, lens, start):  # the static forward only
        wav, out_lens = real_run(rows, codes, lens, start)
        wrong = isinstance(rows, StaticRows) and wav.shape[0] == 2
        return (wav * 2 if wrong else wav), out_lens

    monkeypatch.setattr(stream, "run", wrong_for_two_rows)
    steps.warm_up()
    assert steps.ready == 1 and steps._graphs[2, 4] is None
    assert "2 x 4 frames" in caplog.text and "differs from the eager forward" in caplog.text


def test_the_setting_follows_the_config():
    assert PipelineConfig().code2wav_step_graphs is True  # on since session 34's H200 run
    assert PipelineConfig(code2wav_step_graphs=False).code2wav_step_graphs is False
    with pytest.raises(RuntimeError, match="CUDA"):
        StepGraphs(StreamingCode2Wav(build_stream(TINY_SLIDING).model), (1,), (1,))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_on_cuda_replayed_steps_keep_the_audio():
    """Captured graphs on CUDA: every pair checked at capture; the steps replay them and the
    stream is the plain one within CUDA's float32 convolutions (TF32: ~1e-3,
    test_code2wav_graph.py)."""
    model = build_stream(TINY_SLIDING).model.to("cuda")
    plain, graphed = StreamingCode2Wav(model), _graphed(model, capture=True)
    assert graphed.step_graphs.ready == len(BATCHES) * len(FRAMES)
    codes = [random_codes(90, seed=50 + i).cuda() for i in range(3)]
    want, got = decode_steps(plain, codes, STEPS)[0], decode_steps(graphed, codes, STEPS)[0]
    assert graphed.step_graphs.calls == REPLAYED
    for w, g in zip(joined(want, codes, STEPS), joined(got, codes, STEPS)):
        assert w.shape == g.shape and rel_err(g.cpu(), w.cpu()) < 5e-3


def test_the_live_setting_turns_the_replays_off_and_on(tiny_model_dir):
    """``code2wav_step_graphs`` is live (``POST /debug/pipeline``): the stage logic's ``tune``
    turns the runner's replays off (its steps run eager, the same audio) and on again."""
    from omni_ray.config.serving import StageConfig
    from omni_ray.pipeline.code2wav import Code2WavLogic
    from omni_ray.runners.factory import make_runner

    cfg = PipelineConfig(code2wav_pad_shapes=True, code2wav_max_batch=2,
                         initial_chunk_frames=2, ramp_chunks=True)
    runner = make_runner("code2wav", tiny_model_dir, StageConfig(device="cpu", dtype="float32"),
                         pipeline=cfg)
    stream = runner._stream  # on CPU the runner captures none: the same buffers, run eagerly
    stream.step_graphs = StepGraphs(stream, *cfg.code2wav_shapes("float32"), capture=False)
    stream.step_graphs.warm_up()
    logic = Code2WavLogic(runner, max_batch=2)
    codes = {rid: random_codes(12, seed=90 + i) for i, rid in enumerate("ab")}
    for rid in codes:
        runner.add_request(rid)
    runner.decode_many([(rid, c[:2]) for rid, c in codes.items()])  # first calls: eager
    runner.decode_many([(rid, c[2:4]) for rid, c in codes.items()])
    assert runner.time_spent["graph_steps"] == 1
    logic.tune(cfg.tuned({"code2wav_step_graphs": False}))
    runner.decode_many([(rid, c[4:8]) for rid, c in codes.items()])
    assert runner.time_spent["graph_steps"] == 1  # eager
    logic.tune(cfg.tuned({"code2wav_step_graphs": True}))
    runner.decode_many([(rid, c[8:12]) for rid, c in codes.items()])
    assert runner.time_spent["graph_steps"] == 2
