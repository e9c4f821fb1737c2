"""ThinkerChunker and CodecChunker: chunk accounting without a model.

Both must keep ``seq`` gap-free and end with exactly one finished chunk; sync holds everything
until the request finishes; async_chunk forwards as early as its sizes allow; no token or frame
is lost, doubled or reordered.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_ray.payload import FinishReason
from omni_ray.pipeline.chunking import TALKER_FIRST_FRAME_TOKENS, CodecChunker, ThinkerChunker

MODES = ("sync", "async_chunk")
REASONS = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT)


def _check_stream(chunks, reason):
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c.finish_reason for c in chunks] == [FinishReason.NONE] * (len(chunks) - 1) + [reason]
    for c in chunks:
        c.validate()


# -- ThinkerChunker ------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 151_000), max_size=3), min_size=1, max_size=12),
       mode=st.sampled_from(MODES), reason=st.sampled_from(REASONS))
def test_thinker_chunker_stream(steps, mode, reason):
    prompt = [151644, 872, 9707, 151645, 198, 151644, 77091, 198]
    chunker = ThinkerChunker("r", prompt, mode)
    chunks = []
    for i, ids in enumerate(steps):
        last = i == len(steps) - 1
        out = chunker.add(ids, last, reason if last else FinishReason.NONE)
        if mode == "sync":
            assert len(out) == (1 if last else 0)  # sync holds everything
        else:
            assert len(out) == 1 and out[0].token_ids == ids  # async forwards every step
        chunks += out
    _check_stream(chunks, reason)
    assert [t for c in chunks for t in c.token_ids] == [t for ids in steps for t in ids]
    assert chunks[0].prompt_token_ids == prompt
    assert all(c.prompt_token_ids is None and c.mm_hidden is None for c in chunks[1:])


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 151_000), max_size=3),
                                st.floats(0, 0.05)), min_size=1, max_size=20),
       interval=st.sampled_from([0.01, 0.02, 0.04]), reason=st.sampled_from(REASONS))
def test_thinker_chunker_interval(steps, interval, reason):
    """text_chunk_ms: the first chunk, and every chunk until the talker has the tokens of its
    first frame, at once; then at most one chunk per interval (a chunk goes as soon as a step
    comes after the interval), the last when the request finishes; every token exactly once,
    in order."""
    now = [0.0]
    chunker = ThinkerChunker("r", [1, 2, 3], "async_chunk", interval_s=interval,
                             clock=lambda: now[0])
    chunks, sent_at, eager_at = [], [], []
    for i, (ids, dt) in enumerate(steps):
        now[0] += dt
        last = i == len(steps) - 1
        out = chunker.add(ids, last, reason if last else FinishReason.NONE)
        held = [t for s_ids, _ in steps[:i + 1] for t in s_ids][len(
            [t for c in chunks for t in c.token_ids]):]
        sent = len([t for c in chunks for t in c.token_ids])
        eager = not chunks or (held and sent < TALKER_FIRST_FRAME_TOKENS)
        due = eager or last or (held and now[0] - sent_at[-1] >= interval)
        assert len(out) == (1 if due else 0), (i, now[0], sent_at)
        chunks += out
        sent_at += [now[0]] * len(out)
        eager_at += [eager] * len(out)
    _check_stream(chunks, reason)
    assert [t for c in chunks for t in c.token_ids] == [t for ids, _ in steps for t in ids]
    assert all(b - a >= interval for a, b, e in zip(sent_at[:-1], sent_at[1:-1], eager_at[1:-1])
               if not e)


def test_thinker_chunker_mm_hidden_rides_on_chunk_zero():
    hidden = torch.randn(3, 8)
    chunker = ThinkerChunker("r", [1, 2, 3], "async_chunk", mm_hidden=hidden)
    first, second = chunker.add([5], False) + chunker.add([6], True, FinishReason.STOP)
    assert first.mm_hidden is hidden and second.mm_hidden is None


# -- CodecChunker --------------------------------------------------------------------------------
def _frames(start: int, n: int) -> torch.Tensor:
    """n frames whose codes identify the frame index (so loss, doubling or reordering shows)."""
    return (torch.arange(start, start + n).view(-1, 1) * 16 + torch.arange(16)).long()


def _run_codec(counts, mode, initial, size, reason, ramp=False, ratio=1.0):
    chunker = CodecChunker("r", mode, initial, size, ramp=ramp, ratio=ratio)
    chunks, made = [], 0
    for i, n in enumerate(counts):
        last = i == len(counts) - 1
        out = chunker.add(_frames(made, n), last, reason if last else FinishReason.NONE)
        made += n
        chunks.append(out)
    return chunks, made


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=80),
       initial=st.integers(1, 8), size=st.integers(1, 30),
       mode=st.sampled_from(MODES), reason=st.sampled_from(REASONS), ramp=st.booleans())
def test_codec_chunker_loses_and_doubles_nothing(counts, initial, size, mode, reason, ramp):
    per_add, total = _run_codec(counts, mode, initial, size, reason, ramp)
    chunks = [c for out in per_add for c in out]
    _check_stream(chunks, reason)
    codes = torch.cat([c.codes for c in chunks])
    assert torch.equal(codes, _frames(0, total))
    starts = [c.start_frame for c in chunks]
    assert starts == [sum(c.codes.shape[0] for c in chunks[:i]) for i in range(len(chunks))]


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=80),
       initial=st.integers(1, 8), size=st.integers(1, 30))
def test_codec_chunker_async_sizes(counts, initial, size):
    per_add, total = _run_codec(counts, "async_chunk", initial, size, FinishReason.STOP)
    chunks = [c for out in per_add for c in out]
    sizes = [c.codes.shape[0] for c in chunks]
    # Every chunk but the last has exactly the configured size: `initial` first, then `size`.
    assert sizes[:-1] == ([initial] + [size] * (len(sizes) - 2))[: len(sizes) - 1]
    # The last one holds the remainder: at most one chunk's worth.
    assert sizes[-1] <= (initial if len(sizes) == 1 else size)
    # Nothing is held back once a full chunk exists (first audio as early as possible).
    made = sent = 0
    for n, out in zip(counts[:-1], per_add[:-1]):
        made += n
        sent += sum(c.codes.shape[0] for c in out)
        want = initial if sent == 0 else size
        assert made - sent < want


def _ramp_sizes(initial: int, size: int, n: int, ratio: float) -> list[int]:
    """The first n chunk sizes with ramp_chunks (written out, not read from the chunker): each
    after the first is ``ratio`` x the frames sent before it, rounded up, at most ``size``."""
    out = [initial]
    while len(out) < n:
        sent = sum(out)
        out.append(min(size, max(1, math.ceil(Fraction(str(ratio)) * sent))))  # exact
    return out[:n]


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=80),
       initial=st.integers(1, 8), size=st.integers(1, 30),
       ratio=st.sampled_from([0.3, 0.5, 1.0, 1.1, 1.5, 2.0]))
def test_codec_chunker_ramp_sizes(counts, initial, size, ratio):
    per_add, _ = _run_codec(counts, "async_chunk", initial, size, FinishReason.STOP, ramp=True,
                            ratio=ratio)
    sizes = [c.codes.shape[0] for out in per_add for c in out]
    full = _ramp_sizes(initial, size, len(sizes), ratio)
    assert sizes[:-1] == full[:-1] and sizes[-1] <= full[-1]


@pytest.mark.parametrize("ratio,want", [
    (1.0, [1, 1, 2, 4, 8, 16, 25, 25]),   # 82 frames; 18 wait for more
    (2.0, [1, 2, 6, 18, 25, 25]),         # 77; 23 wait
    (0.5, [1, 1, 1, 2, 3, 4, 6, 9, 14, 21, 25]),  # 87; 13 wait
])
def test_codec_chunker_ramp_example(ratio, want):
    """Each chunk: ``ratio`` x the frames already out, so at ratio 1 making it takes no longer
    than the audio out lasts whenever a frame takes less than its 80 ms."""
    chunker = CodecChunker("r", "async_chunk", 1, 25, ramp=True, ratio=ratio)
    sizes = [c.codes.shape[0] for c in chunker.add(_frames(0, 100), False)]
    assert sizes == want


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=60), size=st.integers(1, 30))
def test_codec_chunker_sync_holds_everything(counts, size):
    per_add, total = _run_codec(counts, "sync", 1, size, FinishReason.LENGTH)
    assert all(out == [] for out in per_add[:-1])
    (only,) = per_add[-1]
    assert only.seq == 0 and only.finished and torch.equal(only.codes, _frames(0, total))


@pytest.mark.parametrize("mode", MODES)
def test_codec_chunker_finish_without_frames(mode):
    (only,) = CodecChunker("r", mode, 4, 25).add(torch.empty(0, 16, dtype=torch.long), True,
                                                 FinishReason.STOP)
    assert only.seq == 0 and only.finished and only.codes.shape == (0, 16)
    assert only.finish_reason == FinishReason.STOP


def test_codec_chunker_exact_multiple_ends_without_an_empty_chunk():
    chunker = CodecChunker("r", "async_chunk", 4, 25)
    assert chunker.add(_frames(0, 3), False) == []
    (a,) = chunker.add(_frames(3, 1), False)
    assert a.codes.shape[0] == 4
    (b,) = chunker.add(_frames(4, 25), True, FinishReason.STOP)  # exactly one chunk's worth
    assert b.finished and b.codes.shape[0] == 25 and b.start_frame == 4


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=60),
       initial=st.integers(1, 8), size=st.integers(1, 30), ramp=st.booleans(),
       reason=st.sampled_from(REASONS))
def test_a_held_first_chunk_goes_with_the_second_and_nothing_else_changes(counts, initial, size,
                                                                          ramp, reason):
    """``hold_first``: the same chunks, but the first leaves in the ``add`` that makes the
    second (or ends the request), never alone before it."""
    plain, _ = _run_codec(counts, "async_chunk", initial, size, reason, ramp)
    chunker = CodecChunker("r", "async_chunk", initial, size, ramp=ramp)
    chunker.hold_first = True
    held, made = [], 0
    for i, n in enumerate(counts):
        last = i == len(counts) - 1
        held.append(chunker.add(_frames(made, n), last, reason if last else FinishReason.NONE))
        made += n
    flat = [c for out in held for c in out]
    _check_stream(flat, reason)
    assert [(c.seq, c.start_frame) for c in flat] == [
        (c.seq, c.start_frame) for out in plain for c in out]
    assert torch.equal(torch.cat([c.codes for c in flat]),
                       torch.cat([c.codes for out in plain for c in out]))
    (first,) = [out for out in held if out and out[0].seq == 0]
    assert len(first) >= 2 or first[0].finished  # with the second, or the last chunk alone
    assert chunker.held is None
