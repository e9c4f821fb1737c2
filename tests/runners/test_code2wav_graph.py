"""The vocoder's first call as a CUDA graph (runners/transformers/code2wav_graph.py).

On CUDA: a replayed first call equals the eager one, and a stream that starts with it equals a
one-shot decode. On CPU (CI): graphs refuse to start, and ``decode_batch`` hands exactly the
fresh, first-chunk batches to them and carries the state they return.
"""

from __future__ import annotations

import pytest
import torch
from code2wav_helpers import TINY_SLIDING, TOL, build_stream, one_shot, random_codes, rel_err

from omni_ray.runners.transformers.code2wav_graph import BUCKETS, FirstCallGraphs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@pytest.fixture(scope="module")
def stream():
    return build_stream(TINY_SLIDING, seed=1)


def test_graphs_refuse_a_model_off_cuda(stream):
    with pytest.raises(RuntimeError, match="CUDA"):
        FirstCallGraphs(stream, 1)


class _Recording:
    """Stands in for ``FirstCallGraphs`` on CPU: the eager forward, with the calls recorded."""

    def __init__(self, stream, frames):
        self.stream, self.frames, self.calls = stream, frames, []

    def applies(self, states, codes):
        return all(s.frames_in == 0 for s in states) and all(c.shape[0] == self.frames
                                                             for c in codes)

    def __call__(self, states, codes):
        self.calls.append(len(states))
        return self.stream._forward(states, codes)


def test_decode_batch_sends_first_chunks_to_the_graphs_and_keeps_their_state(stream):
    codes = [random_codes(9, seed=s) for s in range(3)]
    stream.first_graphs = rec = _Recording(stream, 1)
    try:
        states = [stream.new_state() for _ in codes]
        outs = [stream.decode_batch(states, [c[:1] for c in codes])]   # fresh, 1 frame: graphs
        outs.append(stream.decode_batch(states, [c[1:3] for c in codes]))  # carried: eager
        late = stream.new_state()                                      # fresh but 2 frames: eager
        stream.decode_batch([late], [codes[0][:2]])
    finally:
        stream.first_graphs = None
    assert rec.calls == [3]
    for b, c in enumerate(codes):
        got = torch.cat([outs[0][b], outs[1][b]])
        want = one_shot(stream, c[:3])[: len(got)]
        assert rel_err(got, want) < TOL
        assert states[b].frames_in == 3


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n", [1, 3, 8])
def test_replayed_first_call_equals_eager_and_continues_exactly(n):
    s = build_stream(TINY_SLIDING, seed=1)
    s.model.to("cuda")
    graphs = FirstCallGraphs(s, 2)
    graphs.warm_up()
    assert graphs.ready == len(BUCKETS) and graphs.calls == 0
    codes = [random_codes(12, seed=10 + i).cuda() for i in range(n)]
    eager_states = [s.new_state() for _ in codes]
    eager = s.decode_batch(eager_states, [c[:2] for c in codes])
    assert (s.forwards, s.shapes) == (1, {(n, 2)})  # eager forwards are counted
    s.first_graphs = graphs
    states = [s.new_state() for _ in codes]
    got = s.decode_batch(states, [c[:2] for c in codes])
    assert graphs.calls == 1 and s.forwards == 1  # a replay is not an eager forward
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    rest = s.decode_batch(states, [c[2:] for c in codes])
    rest_eager = s.decode_batch(eager_states, [c[2:] for c in codes])
    assert (s.forwards, s.new_shapes) == (3, 2)  # (n, 10) met once, then again
    for a, b in zip(rest, rest_eager):  # the replay's state continues as the eager call's
        assert torch.equal(a, b)
    for b, c in enumerate(codes):  # and the stream stays the one-shot decode, within CUDA's
        want = one_shot(s, c).cpu()  # float32 convolutions (TF32 in cuDNN: ~1e-3, seen 9e-4
        full = torch.cat([got[b], rest[b]]).cpu()  # on an H200, eager or replayed alike)
        assert rel_err(full, want[: len(full)]) < 5e-3


def test_states_copied_out_of_the_graphs_buffers_are_equal_and_their_own(stream):
    """After a replay each request's state is copied out of the graph's buffers (which the next
    replay overwrites): same values, same keys, counters kept, no tensor shared with the
    buffers or another request."""
    from omni_ray.runners.transformers.code2wav_graph import _copy_states, _tensors

    gen = torch.Generator().manual_seed(0)
    srcs = [stream.new_state() for _ in range(3)]
    for i, s in enumerate(srcs):
        for t in _tensors(s):
            t.copy_(torch.randn(t.shape, generator=gen))
        s.frames_in, s.samples_out = i + 1, 1920 * (i + 1) - 555
    dsts = [stream.new_state() for _ in srcs]
    _copy_states(srcs, dsts)
    def held(state):  # the tensors that hold memory (an empty one has none to share)
        return [t for t in _tensors(state) if t.numel()]

    ptrs = {t.untyped_storage().data_ptr() for s in srcs for t in held(s)}
    for s, d in zip(srcs, dsts):
        assert list(d.conv_tails) == list(s.conv_tails)
        assert list(d.trans_tails) == list(s.trans_tails)
        assert all(torch.equal(a, b) for a, b in zip(_tensors(d), _tensors(s)))
        assert (d.frames_in, d.samples_out) == (s.frames_in, s.samples_out)
        ptrs |= {t.untyped_storage().data_ptr() for t in held(d)}
    assert len(ptrs) == 2 * sum(len(held(s)) for s in srcs)
