"""Code2wav's eager forwards padded up to a few shapes, each run once at start (code2wav_shapes.py).

The padding must not change any request's audio or carried state beyond float noise (TOL, as for
batching: test_code2wav_stream.py's docstring), and after the warm-up a stream of the pipeline's
chunk sizes, batched up to the stage's batch, must meet no shape first.
"""

from __future__ import annotations

import copy

import pytest
import torch

from code2wav_helpers import (SAMPLES_PER_FRAME, TINY_SLIDING, TOL, WITHHELD, build_stream,
                              decode_steps, joined, one_shot, random_codes, rel_err)

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.runners.transformers.code2wav_shapes import ShapeBuckets
from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav

BATCHES, FRAMES = (1, 2, 4), (1, 2, 4, 8, 16, 25)
# per step, each request's new frames (0: nothing this step): 3 + 5 -> 8 frames, 30 is longer
# than every bucket (runs unpadded), 1-2 row steps pad to 2, 3 rows to 4
STEPS = [(2, 2, 2), (2, 2, 0), (4, 3, 4), (8, 5, 7), (16, 25, 1), (25, 30, 0), (3, 0, 9)]


@pytest.fixture(scope="module")
def model():
    return build_stream(TINY_SLIDING).model


def test_padded_forwards_give_each_request_its_unpadded_audio_and_state(model):
    plain, padded = StreamingCode2Wav(model), StreamingCode2Wav(model)
    padded.buckets = ShapeBuckets(padded, BATCHES, FRAMES)
    blank = copy.deepcopy(padded.buckets._blank)
    codes = [random_codes(80, seed=30 + i) for i in range(3)]
    want, want_states, pos = decode_steps(plain, codes, STEPS)
    got, got_states, _ = decode_steps(padded, codes, STEPS)
    for w_step, g_step in zip(want, got):
        for w, g in zip(w_step, g_step):
            assert w.shape == g.shape and rel_err(g, w) < TOL
    # the forwards ran at the padded shapes: (rows, frames) of each step above
    assert padded.shapes == {(4, 2), (2, 2), (4, 4), (4, 8), (4, 25), (2, 30), (2, 16)}
    assert plain.shapes == {(3, 2), (2, 2), (3, 4), (3, 8), (3, 25), (2, 30), (2, 9)}
    for w, g, c, n in zip(want_states, got_states, codes, pos):
        assert (g.frames_in, g.samples_out) == (w.frames_in, w.samples_out) == \
            (n, n * SAMPLES_PER_FRAME - WITHHELD)
        # the carried state agrees: the rest of each stream decodes to its one-shot audio
        rest_w, rest_g = plain.decode(w, c[n:]), padded.decode(g, c[n:])
        assert rel_err(rest_g, rest_w) < TOL
    for c, n, audio in zip(codes, pos, joined(got, codes, STEPS)):  # each stream is its one-shot
        assert rel_err(audio, one_shot(padded, c[:n])) < TOL
    # the filler rows' blank state is never written
    for a, b in zip([*blank.keys, *blank.conv_tails.values()],
                    [*padded.buckets._blank.keys, *padded.buckets._blank.conv_tails.values()]):
        assert torch.equal(a, b) and not a.any()


def test_after_the_warm_up_no_forward_meets_a_shape_first(model):
    """``warm_up`` runs every (batch, frames) pair; streams of chunk sizes up to the largest
    bucket then meet none first; a longer chunk runs unpadded and is counted as new."""
    stream = StreamingCode2Wav(model)
    stream.buckets = ShapeBuckets(stream, BATCHES, FRAMES)
    stream.buckets.warm_up()
    assert stream.buckets.warmed == len(BATCHES) * len(FRAMES) == len(stream.shapes)
    assert (stream.forwards, stream.new_shapes) == (0, 0)
    codes = [random_codes(60, seed=s) for s in range(4)]
    states = [stream.new_state() for _ in codes]
    pos = 0
    for n, rows in [(2, 4), (2, 3), (3, 1), (7, 4), (13, 2), (25, 4)]:
        stream.decode_batch(states[:rows], [c[pos:pos + n] for c in codes[:rows]])
        pos += n
    assert (stream.forwards, stream.new_shapes) == (6, 0)
    stream.decode_batch(states[:1], [codes[0][:0]])  # nothing new: no forward
    stream.decode(states[0], random_codes(26))       # longer than 25: unpadded, a new shape
    assert (stream.forwards, stream.new_shapes) == (7, 1)


@pytest.mark.parametrize("setting, dtype, mode, want", [
    (None, "bfloat16", "stateful", ((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 25))),
    (None, "float32", "stateful", None),   # float32: one request a forward, exact: unpadded
    (False, "bfloat16", "stateful", None),
    (True, "float32", "stateful", ((1,), (1, 2, 4, 8, 16, 25))),
    (True, "bfloat16", "window", None),    # window mode has no eager stateful forward
])
def test_the_shapes_follow_the_config(setting, dtype, mode, want):
    """``PipelineConfig.code2wav_shapes`` decides the sizes: powers of two up to code2wav's
    batch; up to the chunk size, with the first chunk's size among them."""
    cfg = PipelineConfig(code2wav_pad_shapes=setting, code2wav_mode=mode)
    assert cfg.code2wav_shapes(dtype) == want
    odd = PipelineConfig(initial_chunk_frames=3, chunk_frames=20, code2wav_max_batch=12)
    assert odd.code2wav_shapes("float16") == ((1, 2, 4, 8, 12), (1, 2, 3, 4, 8, 16, 20))


def test_the_runner_from_the_tiny_checkpoint_warms_its_shapes_and_keeps_its_audio(tiny_model_dir):
    """``Code2WavRunner.from_config`` on the tiny checkpoint with the padding on: ``warm_up``
    (``make_runner`` calls it) runs every pair and says so in ``time_spent`` and its start
    phases; ``decode_many`` then gives each request the unpadded runner's samples, and meets
    no shape first."""
    from omni_ray.config.serving import StageConfig
    from omni_ray.runners.factory import make_runner

    on = PipelineConfig(code2wav_pad_shapes=True, code2wav_max_batch=4,
                        initial_chunk_frames=2, ramp_chunks=True)
    off = PipelineConfig(code2wav_pad_shapes=False, code2wav_max_batch=4)
    stage = StageConfig(device="cpu", dtype="float32")
    padded = make_runner("code2wav", tiny_model_dir, stage, pipeline=on)
    plain = make_runner("code2wav", tiny_model_dir, stage, pipeline=off)
    assert padded.time_spent["shapes_warmed"] == 3 * 6 and plain.time_spent["shapes_warmed"] == 0
    assert "shape_warmup_s" in padded.start_phases
    codes = {rid: random_codes(40, seed=40 + i) for i, rid in enumerate("abc")}
    for r in (padded, plain):
        for rid in codes:
            r.add_request(rid)
    lo = 0
    for n, rids in [(2, "abc"), (2, "ab"), (4, "abc"), (8, "c"), (21, "abc")]:
        items = [(rid, codes[rid][lo:lo + n]) for rid in rids]
        for (s_w, w), (s_g, g) in zip(plain.decode_many(items), padded.decode_many(items)):
            assert s_w == s_g and w.shape == g.shape and rel_err(g, w) < TOL
        lo += n
    assert padded.time_spent["new_shapes"] == 0 and padded.time_spent["forwards"] == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_cuda_padded_forwards_keep_the_audio_and_meet_no_shape_first():
    """On CUDA (where a shape met first builds its cuDNN plans): after the warm-up the steps meet
    no shape first, and the padded stream is the unpadded one within CUDA's float32
    convolutions (TF32 in cuDNN: ~1e-3, test_code2wav_graph.py)."""
    model = build_stream(TINY_SLIDING).model.to("cuda")
    plain, padded = StreamingCode2Wav(model), StreamingCode2Wav(model)
    padded.buckets = ShapeBuckets(padded, BATCHES, FRAMES)
    padded.buckets.warm_up()
    codes = [random_codes(80, seed=30 + i).cuda() for i in range(3)]
    want, got = decode_steps(plain, codes, STEPS)[0], decode_steps(padded, codes, STEPS)[0]
    assert padded.new_shapes == 1  # only the 30-frame chunk, longer than every bucket
    for w, g in zip(joined(want, codes, STEPS), joined(got, codes, STEPS)):
        assert w.shape == g.shape and rel_err(g.cpu(), w.cpu()) < 5e-3
