"""Stateful streaming code2wav equals one-shot decoding, for any chunking, batched or not.

Tolerance: float32 on CPU is not bit-reproducible across shapes (oneDNN/MKL pick kernels and
thread splits by size), so the one-shot decoder does not even agree with itself: decoding the
first N-7 frames one-shot differs from decoding all N frames on the shared samples by ~1e-6 of
the peak on the tiny random models and ~2.4e-6 at real size. Streaming lands at 1-3e-6; TOL leaves room for
that noise and is still three orders of magnitude below what a broken state gives
(`test_tolerance_catches_broken_state`: >= 1e-3).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from code2wav_helpers import (SAMPLES_PER_FRAME, TINY, TINY_SLIDING, TOL, WITHHELD, build_stream,
                              one_shot, random_codes, rel_err)

from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav


def _stream(stream: StreamingCode2Wav, codes: torch.Tensor, sizes) -> torch.Tensor:
    state, outs, start = stream.new_state(), [], 0
    for n in sizes:
        outs.append(stream.decode(state, codes[start : start + n]))
        start += n
    assert start >= codes.shape[0]
    assert state.frames_in == codes.shape[0]
    assert state.samples_out == sum(len(o) for o in outs)
    return torch.cat(outs)


def _fixed(size: int, frames: int) -> list[int]:
    return [size] * -(-frames // size)


def _random_sizes(frames: int, seed: int, pool=(1, 2, 3, 4, 7, 25, 30)) -> list[int]:
    rng, sizes = random.Random(seed), []
    while sum(sizes) < frames:
        sizes.append(rng.choice(pool))
    return sizes


@pytest.fixture(scope="module")
def tiny() -> StreamingCode2Wav:
    return build_stream(TINY)


@pytest.fixture(scope="module")
def tiny_sliding() -> StreamingCode2Wav:
    return build_stream(TINY_SLIDING, seed=1)


@pytest.fixture(scope="module", params=["tiny", "tiny_sliding"])
def model(request) -> StreamingCode2Wav:
    return request.getfixturevalue(request.param)


def test_test_model_is_audible_and_unclamped(model):
    wav = one_shot(model, random_codes(40))
    assert 0.1 < wav.abs().max().item() < 1.0


def test_sample_accounting(tiny):
    state = tiny.new_state()
    first = tiny.decode(state, random_codes(3))
    assert len(first) == 3 * SAMPLES_PER_FRAME - WITHHELD
    assert len(tiny.decode(state, random_codes(2, seed=1))) == 2 * SAMPLES_PER_FRAME
    assert len(tiny.decode(state, random_codes(0))) == 0
    assert (state.frames_in, state.samples_out) == (5, 5 * SAMPLES_PER_FRAME - WITHHELD)


@pytest.mark.parametrize("chunk", [1, 2, 4, 25])
def test_fixed_chunks_equal_one_shot(model, chunk):
    codes = random_codes(64)
    want = one_shot(model, codes)
    assert len(want) == 64 * SAMPLES_PER_FRAME - WITHHELD
    assert rel_err(_stream(model, codes, _fixed(chunk, 64)), want) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_boundaries_equal_one_shot(model, seed):
    codes = random_codes(90, seed=seed)
    got = _stream(model, codes, _random_sizes(90, seed))
    assert rel_err(got, one_shot(model, codes)) < TOL


@pytest.mark.parametrize("name", ["tiny", "tiny_sliding"])
def test_long_stream_stays_exact_and_bounded(name, request):
    """200 frames in chunks of 7: far past window 4 and past window 72; state never grows."""
    stream = request.getfixturevalue(name)
    codes = random_codes(200, seed=3)
    state, outs = stream.new_state(), []
    size = state.nbytes
    for start in range(0, 200, 7):
        outs.append(stream.decode(state, codes[start : start + 7]))
        assert state.nbytes == size
    assert rel_err(torch.cat(outs), one_shot(stream, codes)) < TOL


def test_decode_batch_equals_per_request(tiny_sliding):
    stream = tiny_sliding
    codes = [random_codes(40, seed=s) for s in range(4)]
    # Requests at different points of their streams: fresh, 1 frame in, 9 in, 20 in.
    states, done = [], [0, 1, 9, 20]
    for c, d in zip(codes, done):
        state = stream.new_state()
        stream.decode(state, c[:d])
        states.append(state)
    new = [3, 0, 12, 1]  # different new-frame counts, one request with nothing new
    chunks = [c[d : d + n] for c, d, n in zip(codes, done, new)]
    alone_states = copy.deepcopy(states)
    alone = [stream.decode(s, c) for s, c in zip(alone_states, chunks)]
    batched = stream.decode_batch(states, chunks)
    for a, b in zip(alone, batched):
        assert a.shape == b.shape
        if len(a):
            assert rel_err(b, a) < TOL
    # The carried states agree too: continuing each request alone gives the same audio.
    nxt = [c[d + n : d + n + 5] for c, d, n in zip(codes, done, new)]
    for s_b, s_a, c in zip(states, alone_states, nxt):
        assert (s_b.frames_in, s_b.samples_out) == (s_a.frames_in, s_a.samples_out)
        assert rel_err(stream.decode(s_b, c), stream.decode(s_a, c)) < TOL


def test_forwards_count_the_batch_and_frame_shapes_they_meet_first():
    """Each eager forward is counted, and counted as new when its (batch, longest new frames)
    had not run before: on CUDA such a forward first builds its convolutions' kernels, which
    is what the step records' ``new_shapes`` lets a GPU run tell apart (session 26)."""
    stream = build_stream(TINY_SLIDING)  # its own: the fixtures' have counted other tests'
    codes = [random_codes(20, seed=s) for s in range(3)]
    states = [stream.new_state() for _ in codes]
    stream.decode_batch(states[:2], [codes[0][:4], codes[1][:2]])    # (2, 4): new
    stream.decode_batch(states[:2], [codes[0][4:6], codes[1][2:6]])  # (2, 4) again
    stream.decode(states[2], codes[2][:4])                           # (1, 4): new
    stream.decode_batch(states, [codes[0][6:9], codes[1][6:7], codes[2][4:5]])  # (3, 3): new
    stream.decode_batch(states[:2], [codes[0][9:9], codes[1][7:7]])  # no frames: no forward
    assert (stream.forwards, stream.new_shapes) == (4, 3)
    assert stream.shapes == {(2, 4), (1, 4), (3, 3)}


def test_batched_stream_equals_one_shot(tiny):
    """Three requests streamed together with their own chunkings reproduce their one-shot audio."""
    codes = [random_codes(50, seed=10 + i) for i in range(3)]
    sizes = [_random_sizes(50, seed=i) for i in range(3)]
    states = [tiny.new_state() for _ in codes]
    outs, pos = [[] for _ in codes], [0, 0, 0]
    step = 0
    while any(p < 50 for p in pos):
        chunks = []
        for i, c in enumerate(codes):
            n = sizes[i][step] if step < len(sizes[i]) else 0
            chunks.append(c[pos[i] : pos[i] + n])
            pos[i] = min(50, pos[i] + n)
        for i, w in enumerate(tiny.decode_batch(states, chunks)):
            outs[i].append(w)
        step += 1
    for c, o in zip(codes, outs):
        assert rel_err(torch.cat(o), one_shot(tiny, c)) < TOL


@pytest.mark.parametrize("part", ["keys", "conv_tails", "trans_tails"])
def test_tolerance_catches_broken_state(tiny_sliding, part):
    """Zeroing any kind of carried state mid-stream is caught by orders of magnitude."""
    codes = random_codes(30)
    state = tiny_sliding.new_state()
    outs = [tiny_sliding.decode(state, codes[:12])]
    held = getattr(state, part)
    for t in held if isinstance(held, list) else held.values():
        t.zero_()
    outs.append(tiny_sliding.decode(state, codes[12:]))
    assert rel_err(torch.cat(outs), one_shot(tiny_sliding, codes)) > 1e-3


def test_rejects_malformed_codes(tiny):
    with pytest.raises(ValueError):
        tiny.decode(tiny.new_state(), random_codes(4)[:, :8])
    with pytest.raises(ValueError):
        tiny.decode_batch([tiny.new_state()], [])


@pytest.mark.slow
def test_real_size_stream_equals_one_shot():
    """Released code2wav shape (hidden 1024, 8 layers, decoder 1536), random weights, 100 frames."""
    stream = build_stream({})
    codes = random_codes(100, seed=4)
    want = one_shot(stream, codes)
    assert 0.1 < want.abs().max().item() < 1.0
    sizes = [4, 1, 1, 2, 2, 4, 25, 3, 25, 7, 1, 25]  # sums to 100
    assert rel_err(_stream(stream, codes, sizes), want) < TOL


def test_runner_decode_many_equals_each_alone_and_isolates_a_failure(tiny):
    """`Code2WavRunner.decode_many` (the stage's batched step) gives every request what
    decoding it alone gives; a request whose codes break the batched forward fails alone, the
    others' audio is unchanged and their streams continue exactly."""
    from omni_ray.runners.transformers.code2wav import Code2WavRunner

    def runner():
        r = Code2WavRunner(tiny.model, mode="stateful")
        for rid in "abcd":
            r.add_request(rid)
        return r

    codes = {rid: random_codes(30, seed=20 + i) for i, rid in enumerate("abcd")}
    alone, batched = runner(), runner()
    for lo, hi in [(0, 1), (1, 4), (4, 29), (29, 30)]:
        want = [alone.decode(rid, codes[rid][lo:hi]) for rid in "abc"]
        items = [(rid, codes[rid][lo:hi]) for rid in "abc"]
        bad = codes["d"][lo:hi, :8]  # malformed: 8 of 16 codebooks
        got = batched.decode_many(items + [("d", bad)])
        assert isinstance(got[3], ValueError) and "codes must be" in str(got[3])
        for (s_w, w), (s_g, g) in zip(want, got[:3]):
            assert s_w == s_g and w.shape == g.shape and rel_err(g, w) < TOL
    for rid in "abc":
        assert batched._reqs[rid].samples_out == 30 * SAMPLES_PER_FRAME - WITHHELD
        assert batched._reqs[rid].num_frames == 30
    assert batched._reqs["d"].num_frames == 0  # its failed chunks changed nothing
    with pytest.raises(ValueError, match="at most one entry per request"):
        batched.decode_many([("a", codes["a"][:1]), ("a", codes["a"][1:2])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_snake_with_factors_computed_once_is_the_modules_own_bits(tiny, dtype):
    """``_snake`` keeps each SnakeBeta's exp(alpha) and 1 / (exp(beta) + eps) between calls:
    the same ops on the same values as the module's forward, so bit for bit its output; a
    changed parameter is seen (the factors follow the parameter's version)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeSnakeBeta

    stream = copy.deepcopy(tiny)
    stream.model.to(dtype)
    snakes = [m for m in stream.model.modules() if isinstance(m, Qwen3OmniMoeSnakeBeta)]
    assert len(snakes) > 5
    gen = torch.Generator().manual_seed(0)
    for mod in snakes:
        x = (torch.randn(3, mod.in_features, 17, generator=gen) * 4).to(dtype)
        assert torch.equal(stream._snake(mod, x), mod(x))
        with torch.no_grad():
            mod.beta.add_(0.25)
        assert torch.equal(stream._snake(mod, x), mod(x))


@pytest.mark.parametrize("shape", [(5, 3, 20), (5, 2, 20, 4)])
def test_rows_at_copies_each_rows_window_into_its_own_tensor(shape):
    """A request's carried state: row b's ``x[b, :, s_b:s_b + w]``, equal bit for bit, in a
    tensor of its own (a finished neighbour's state must not keep the batch's alive)."""
    from omni_ray.runners.transformers.code2wav_stream import _rows_at

    x = torch.randn(*shape)
    starts = [3, 0, 3, 7, 3]  # repeats: cut together
    rows = _rows_at(x, starts, 4)
    ptrs = {x.untyped_storage().data_ptr()}
    for b, (row, s) in enumerate(zip(rows, starts)):
        assert torch.equal(row, x[b, :, s:s + 4]) and row.is_contiguous()
        ptrs.add(row.untyped_storage().data_ptr())
    assert len(ptrs) == len(starts) + 1  # every row its own storage, none the batch's
