"""The pipeline core with fake runners: routing, ordering, chunking, abort, errors, faults.

No Ray, no model: each test runs in milliseconds. The fakes satisfy the runner contracts
(``omni_ray/pipeline/contracts.py``), checked first.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.kv_lifecycle import KVLoadError
from omni_ray.payload import AudioChunk, CodecChunk, FinishReason, TextDelta, ThinkerChunk
from omni_ray.pipeline.code2wav import Code2WavLogic
from omni_ray.pipeline.contracts import (Code2WavRunnerProtocol, KVThinkerRunnerProtocol,
                                         TalkerRunnerProtocol, ThinkerRunnerProtocol)
from omni_ray.pipeline.kv import DecodeThinkerLogic, PrefillLogic
from omni_ray.pipeline.local import LocalPipeline
from omni_ray.pipeline.talker import TalkerLogic
from omni_ray.pipeline.thinker import ThinkerLogic

GROUPS = 2
SAMPLES_PER_FRAME = 4


# -- fakes ------------------------------------------------------------------------------------
@dataclass
class ThinkerOut:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason
    num_prompt_tokens: int
    error: str | None = None
    mm: object = None


@dataclass
class TalkerOut:
    request_id: str
    frames: torch.Tensor
    finished: bool
    finish_reason: FinishReason
    error: str | None = None


class FakeThinker:
    """Token ``t`` of a request is ``prompt[0] * 100 + t``; ``fail[rid] = t`` fails step ``t``."""

    def __init__(self):
        self.seqs: dict[str, dict] = {}
        self.fail: dict[str, int] = {}

    def add_request(self, request_id, prompt_ids, params, max_tokens, stop_token_ids=None,
                    mm=None):
        if request_id in self.seqs:
            raise ValueError(f"duplicate request_id {request_id!r}")
        self.seqs[request_id] = dict(prompt=list(prompt_ids), n=0, max=max_tokens)

    def step(self):
        outs = []
        for rid, s in list(self.seqs.items()):
            if self.fail.get(rid) == s["n"]:
                del self.seqs[rid]
                outs.append(ThinkerOut(rid, [], True, FinishReason.ERROR, len(s["prompt"]),
                                       "RuntimeError: boom"))
                continue
            tok = s["prompt"][0] * 100 + s["n"]
            s["n"] += 1
            done = s["n"] >= s["max"]
            if done:
                del self.seqs[rid]
            outs.append(ThinkerOut(rid, [tok], done,
                                   FinishReason.LENGTH if done else FinishReason.NONE,
                                   len(s["prompt"])))
        return outs

    def has_unfinished(self):
        return bool(self.seqs)

    # the KV hand-off (pipeline/kv.py): a "cache" is the prompt itself
    def prefill_only(self, prompt_ids, params):
        return SimpleNamespace(first_token=prompt_ids[0] * 100, cache=list(prompt_ids),
                               num_tokens=len(prompt_ids), rng_state=None, rope_delta=0)

    def extract_kv(self, pre):
        return torch.tensor(pre.cache, dtype=torch.float32).reshape(1, 1, 1, -1, 1)

    def add_prefilled_kv(self, request_id, prompt_ids, first_token, kv, params, max_tokens,
                         stop_token_ids=None, *, rng_state=None, rope_delta=0):
        if kv.flatten().tolist() != list(prompt_ids):
            raise ValueError("KV of another prompt")
        self.add_request(request_id, prompt_ids, params, max_tokens, stop_token_ids)

    def abort(self, request_id):
        return self.seqs.pop(request_id, None) is not None

    @property
    def num_requests(self):
        return len(self.seqs)


class FakeTalker:
    """Frame ``n`` needs text token ``n`` (or the text's end) and is ``text[n]`` in every
    group; the request ends two frames after its text, or at ``max_frames``."""

    num_code_groups = GROUPS

    def __init__(self):
        self.seqs: dict[str, dict] = {}
        self.fail: dict[str, int] = {}
        self.steps = 0

    def check_request(self, speaker, max_frames):
        if speaker != "ethan":
            raise ValueError(f"unknown speaker {speaker!r}")

    def add_request(self, request_id, speaker, params, max_frames):
        self.check_request(speaker, max_frames)
        self.seqs[request_id] = dict(prompt=None, text=[], done=False, n=0, max=max_frames)

    def push_text(self, request_id, token_ids, finished, prompt_token_ids=None, mm_hidden=None,
                  image_grid_thw=None, audio_feature_lengths=None):
        s = self.seqs[request_id]
        if prompt_token_ids is not None:
            s["prompt"] = list(prompt_token_ids)
        assert s["prompt"] is not None, "text before the prompt"
        s["text"] += token_ids
        s["done"] = finished

    def _ready(self, s):
        return s["prompt"] is not None and (s["done"] or len(s["text"]) > s["n"])

    def has_ready(self):
        return any(self._ready(s) for s in self.seqs.values())

    def step(self):
        self.steps += 1
        outs = []
        for rid, s in list(self.seqs.items()):
            if not self._ready(s):
                continue
            if self.fail.get(rid) == s["n"]:
                del self.seqs[rid]
                outs.append(TalkerOut(rid, torch.empty((0, GROUPS), dtype=torch.long), True,
                                      FinishReason.ERROR, "RuntimeError: talker boom"))
                continue
            n, text = s["n"], s["text"]
            frame = torch.full((1, GROUPS), text[n] if n < len(text) else 7, dtype=torch.long)
            s["n"] += 1
            reason = (FinishReason.LENGTH if s["n"] >= s["max"] else
                      FinishReason.STOP if s["done"] and s["n"] >= len(text) + 2 else
                      FinishReason.NONE)
            if reason != FinishReason.NONE:
                del self.seqs[rid]
            outs.append(TalkerOut(rid, frame, reason != FinishReason.NONE, reason))
        return outs

    def abort(self, request_id):
        return self.seqs.pop(request_id, None) is not None

    @property
    def num_requests(self):
        return len(self.seqs)


class FakeCode2Wav:
    """``SAMPLES_PER_FRAME`` samples per frame, each the frame's group-0 code."""

    dtype = "float32"

    def __init__(self):
        self.reqs: dict[str, int] = {}
        self.fail: set[str] = set()
        self.batches: list[list[str]] = []  # the request ids of each decode_many call

    def add_request(self, request_id):
        self.reqs[request_id] = 0

    def decode_many(self, items):
        """Like the real runner: a failing request's entry is its exception."""
        self.batches.append([rid for rid, _ in items])
        out = []
        for rid, codes in items:
            if rid in self.fail:
                out.append(RuntimeError("bad codes"))
                continue
            start = self.reqs[rid]
            samples = codes[:, 0].float().repeat_interleave(SAMPLES_PER_FRAME)
            self.reqs[rid] += samples.numel()
            out.append((start, samples))
        return out

    def finish(self, request_id):
        self.reqs.pop(request_id, None)

    def abort(self, request_id):
        return self.reqs.pop(request_id, None) is not None

    @property
    def num_requests(self):
        return len(self.reqs)


class Run:
    """A ``LocalPipeline`` over fresh fakes that records every emit it routes."""

    def __init__(self, mode="async_chunk", initial=2, size=3, **pipeline):
        self.pipeline_cfg = PipelineConfig(mode=mode, initial_chunk_frames=initial,
                                           chunk_frames=size, **pipeline)
        self.thinker, self.talker, self.code2wav = FakeThinker(), FakeTalker(), FakeCode2Wav()
        self.logics = [ThinkerLogic(self.thinker, self.pipeline_cfg),
                       TalkerLogic(self.talker, self.pipeline_cfg, GROUPS),
                       Code2WavLogic(self.code2wav)]
        self.emits: list[tuple[str, object]] = []
        self.local = LocalPipeline(self.logics, tap=lambda stage, e: self.emits.append((stage, e)))

    def items(self, rid, kind):
        return [e.item for _, e in self.emits if e.request_id == rid and isinstance(e.item, kind)]

    def errors(self, rid):
        return [(stage, e.error) for stage, e in self.emits
                if e.request_id == rid and e.error is not None]

    def assert_clean(self):
        """Nothing of any request is left in any logic or runner."""
        assert [lg.request_ids() for lg in self.logics] == [[], [], []]
        assert (self.thinker.num_requests, self.talker.num_requests,
                self.code2wav.num_requests) == (0, 0, 0)


def req(rid, first=1, tokens=6, frames=50, **kw):
    return OmniRequest(request_id=rid, prompt_token_ids=[first, 2, 3], max_tokens=tokens,
                       max_audio_frames=frames, **kw)


def expected_text(first, tokens):
    return [first * 100 + t for t in range(tokens)]


def test_fakes_satisfy_the_contracts():
    assert isinstance(FakeThinker(), ThinkerRunnerProtocol)
    assert isinstance(FakeThinker(), KVThinkerRunnerProtocol)
    assert isinstance(FakeTalker(), TalkerRunnerProtocol)
    assert isinstance(FakeCode2Wav(), Code2WavRunnerProtocol)


# -- ordering ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["async_chunk", "sync"])
def test_every_edge_is_in_order_gap_free_and_ends_once(mode):
    run = Run(mode)
    results = run.local.run([req("a", 1, tokens=5), req("b", 2, tokens=9), req("c", 3, tokens=1)])
    for res, (first, n) in zip(results, [(1, 5), (2, 9), (3, 1)]):
        rid = res.request.request_id
        assert res.text_ids == expected_text(first, n) and res.error is None
        assert res.finish_reason == FinishReason.LENGTH
        for kind in (TextDelta, ThinkerChunk, CodecChunk, AudioChunk):
            items = run.items(rid, kind)
            assert [c.seq for c in items] == list(range(len(items))), (rid, kind)
            assert [c.finished for c in items] == [False] * (len(items) - 1) + [True]
        codecs = run.items(rid, CodecChunk)
        assert [c.start_frame for c in codecs] == [sum(len(x.codes) for x in codecs[:i])
                                                   for i in range(len(codecs))]
        audio = run.items(rid, AudioChunk)
        assert [a.start_sample for a in audio] == [sum(x.samples.numel() for x in audio[:i])
                                                   for i in range(len(audio))]
        # n text frames, then two more; group 0 of each frame decoded to SAMPLES_PER_FRAME
        frames = torch.cat(res.codes)
        assert frames[:, 0].tolist() == expected_text(first, n) + [7, 7]
        assert torch.equal(torch.cat(res.audio),
                           frames[:, 0].float().repeat_interleave(SAMPLES_PER_FRAME))
        assert res.ttft is not None and res.ttfa is not None
    run.assert_clean()


# -- async_chunk vs sync routing -------------------------------------------------------------
def test_sync_sends_one_chunk_per_edge_at_the_end():
    run = Run("sync")
    res = run.local.run([req("a", 4, tokens=7)])[0]
    (tc,) = run.items("a", ThinkerChunk)
    assert tc.finished and tc.token_ids == expected_text(4, 7) and tc.prompt_token_ids == [4, 2, 3]
    (cc,) = run.items("a", CodecChunk)
    assert cc.finished and cc.codes.shape == (9, GROUPS)
    # the talker starts only after the thinker's last token
    order = [(stage, type(e.item).__name__, e.final) for stage, e in run.emits]
    assert order.index(("thinker", "TextDelta", True)) < order.index(("talker", "CodecChunk", True))
    assert len(res.audio) == 1  # one decode, at the end


def test_async_streams_each_edge_and_equals_sync():
    sync, stream = Run("sync"), Run("async_chunk", text_chunk_ms=0)
    reqs = [req("a", 1, tokens=8), req("b", 2, tokens=3, frames=4)]
    out_sync, out_async = sync.local.run(reqs), stream.local.run(reqs)
    for s, a in zip(out_sync, out_async):
        assert s.text_ids == a.text_ids and s.finish_reason == a.finish_reason
        assert torch.equal(torch.cat(s.codes), torch.cat(a.codes))
        assert torch.equal(torch.cat(s.audio), torch.cat(a.audio))
    assert len(stream.items("a", ThinkerChunk)) == 8  # one per thinker step
    assert stream.items("a", ThinkerChunk)[0].prompt_token_ids == [1, 2, 3]
    assert all(c.prompt_token_ids is None for c in stream.items("a", ThinkerChunk)[1:])
    # the talker speaks (and code2wav decodes) before the thinker is done
    order = [(stage, e.request_id, type(e.item).__name__, e.final) for stage, e in stream.emits]
    assert (order.index(("code2wav", "a", "AudioChunk", False))
            < order.index(("thinker", "a", "TextDelta", True)))
    # text_chunk_ms (the default): the same answers from fewer text pushes (the fakes are
    # instant: the talker's first-frame tokens at once, one by one, the rest with the last)
    held = Run("async_chunk")
    assert held.pipeline_cfg.text_chunk_ms > 0
    for s, h in zip(out_sync, held.local.run(reqs)):
        assert s.text_ids == h.text_ids and s.finish_reason == h.finish_reason
        assert torch.equal(torch.cat(s.codes), torch.cat(h.codes))
        assert torch.equal(torch.cat(s.audio), torch.cat(h.audio))
    assert [len(c.token_ids) for c in held.items("a", ThinkerChunk)] == [1, 1, 1, 5]
    # "b" ends at max_audio_frames while its text goes on: late text is dropped
    b = out_async[1]
    assert torch.cat(b.codes).shape[0] == 4 and b.text_ids == expected_text(2, 3)


@pytest.mark.parametrize("frames, sizes", [(10, [2, 3, 3, 2]), (8, [2, 3, 3]), (1, [1]),
                                           (2, [2]), (3, [2, 1])])
def test_codec_chunks_are_initial_then_size_frames(frames, sizes):
    run = Run("async_chunk", initial=2, size=3)
    res = run.local.run([req("a", 1, tokens=20, frames=frames)])[0]
    codecs = run.items("a", CodecChunk)
    assert [c.codes.shape[0] for c in codecs] == sizes
    assert sum(sizes) == torch.cat(res.codes).shape[0] == frames
    assert [p.numel() for p in res.audio] == [n * SAMPLES_PER_FRAME for n in sizes]


def test_text_only_request_never_reaches_the_talker():
    run = Run()
    res = run.local.run([req("t", 5, tokens=4, modalities=("text",))])[0]
    assert res.text_ids == expected_text(5, 4) and res.codes == [] and res.audio == []
    assert run.items("t", ThinkerChunk) == [] and run.talker.steps == 0
    run.assert_clean()


def test_thinker_alone_serves_text_and_refuses_audio():
    cfg = PipelineConfig()
    local = LocalPipeline([ThinkerLogic(FakeThinker(), cfg)])
    assert local.run([req("t", tokens=2, modalities=("text",))])[0].text_ids == [100, 101]
    with pytest.raises(ValueError, match="no talker"):
        local.add(req("a"))


# -- abort ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["async_chunk", "sync"])
@pytest.mark.parametrize("after_steps", [0, 1, 3, 6, 9])
def test_abort_mid_request_leaves_nothing_and_others_go_on(mode, after_steps):
    alone = Run(mode).local.run([req("keep", 2, tokens=6)])[0]
    run = Run(mode)
    run.local.add(req("gone", 1, tokens=6))
    run.local.add(req("keep", 2, tokens=6))
    for _ in range(after_steps):
        run.local.step()
    run.local.abort("gone")
    assert "gone" not in run.local.results
    while not run.local.all_done():
        assert run.local.step()
    keep = run.local.pop("keep")
    assert keep.text_ids == alone.text_ids
    assert torch.equal(torch.cat(keep.codes), torch.cat(alone.codes))
    assert torch.equal(torch.cat(keep.audio), torch.cat(alone.audio))
    run.assert_clean()


def test_a_refused_add_leaves_nothing_behind():
    run = Run()
    with pytest.raises(ValueError, match="unknown speaker"):
        run.local.run([req("ok", 1), req("bad", 2, speaker="nobody")])
    run.assert_clean()
    assert run.local.results == {}
    assert run.local.run([req("ok", 1, tokens=2)])[0].text_ids == [100, 101]  # still usable


def test_a_stall_is_an_error_and_aborts_everything():
    run = Run()
    run.talker._ready = lambda s: False  # the talker never gets going
    with pytest.raises(RuntimeError, match="stalled"):
        run.local.run([req("a", 1, tokens=2)])
    run.assert_clean()


# -- errors and fault injection ----------------------------------------------------------------
def test_a_thinker_error_ends_that_request_everywhere_and_others_go_on():
    alone = Run().local.run([req("ok", 1, tokens=5)])[0]
    run = Run()
    run.thinker.fail["bad"] = 2
    ok, bad = run.local.run([req("ok", 1, tokens=5), req("bad", 2, tokens=5)])
    assert bad.error == "thinker: RuntimeError: boom" and bad.finish_reason == FinishReason.ERROR
    assert bad.text_ids == expected_text(2, 2)  # what it said before failing
    assert run.errors("bad") == [("thinker", "RuntimeError: boom")]
    assert ok.error is None and ok.text_ids == alone.text_ids
    assert torch.equal(torch.cat(ok.audio), torch.cat(alone.audio))
    run.assert_clean()


def test_a_talker_error_keeps_the_text_and_ends_the_audio():
    run = Run()
    run.talker.fail["bad"] = 3
    ok, bad = run.local.run([req("ok", 1, tokens=5), req("bad", 2, tokens=5)])
    assert bad.error == "talker: RuntimeError: talker boom"
    assert bad.text_ids == expected_text(2, 5) and bad.finish_reason == FinishReason.LENGTH
    assert sum(len(c) for c in bad.codes) < 3  # nothing after the failure
    assert ok.error is None and torch.cat(ok.codes).shape[0] == 7
    run.assert_clean()


def test_a_code2wav_error_ends_that_request_only():
    run = Run()
    run.code2wav.fail.add("bad")
    ok, bad = run.local.run([req("ok", 1, tokens=4), req("bad", 2, tokens=4)])
    assert bad.error == "code2wav: RuntimeError: bad codes" and bad.audio == []
    assert bad.text_ids == expected_text(2, 4)
    assert ok.error is None and sum(p.numel() for p in ok.audio) == 6 * SAMPLES_PER_FRAME
    run.assert_clean()


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_injected_fault_fails_the_request_at_that_stage(stage):
    run = Run()
    run.local.add(req("bad", 2, tokens=6))
    run.local.add(req("ok", 1, tokens=6))
    for _ in range(3):
        run.local.step()
    run.logics[stage].fail_next_step("bad")
    while not run.local.all_done():
        assert run.local.step()
    name = run.logics[stage].stage
    assert run.local.pop("bad").error == f"{name}: injected fault in {name}"
    assert run.local.pop("ok").error is None
    run.assert_clean()


def test_an_errored_upstream_chunk_fails_the_request_downstream():
    """What an engine receives from a failed upstream (Serve path): an ERROR chunk ends it."""
    cfg = PipelineConfig()
    talker = TalkerLogic(FakeTalker(), cfg, GROUPS)
    talker.add(req("a"), True)
    (e,) = talker.on_chunk(ThinkerChunk(request_id="a", seq=0, token_ids=[], finished=True,
                                        finish_reason=FinishReason.ERROR))
    assert (e.target, e.final, e.error) == ("out", True, "thinker failed")
    assert talker.request_ids() == [] and talker.runner.num_requests == 0
    assert talker.on_chunk(ThinkerChunk(request_id="a", seq=1, token_ids=[1])) == []  # late
    c2w = Code2WavLogic(FakeCode2Wav())
    c2w.add(req("a"), False)
    (e,) = c2w.on_chunk(CodecChunk(request_id="a", seq=0, start_frame=0,
                                   codes=torch.empty((0, GROUPS), dtype=torch.long),
                                   finished=True, finish_reason=FinishReason.ERROR))
    assert e.error == "talker failed" and c2w.request_ids() == [] and not c2w.has_work()


def _codec(rid, seq, start, frames, finished=False):
    codes = torch.full((frames, GROUPS), seq + 1, dtype=torch.long)
    return CodecChunk(request_id=rid, seq=seq, start_frame=start, codes=codes, finished=finished)


@pytest.mark.parametrize("first_chunks_first", [True, False])
def test_a_new_requests_first_chunk_is_decoded_before_others_later_chunks(first_chunks_first):
    """Two requests playing (their first chunks out) have 25-frame chunks pending when a third
    one's first chunk arrives: with ``first_chunks_first`` it gets a step of its own; every
    request's audio is the same either way. A step is one forward (up to 4 requests here)."""
    c2w = Code2WavLogic(FakeCode2Wav(), first_chunks_first=first_chunks_first, max_batch=4,
                        clock=lambda: 0.0)  # no one late
    for rid in "abc":
        c2w.add(req(rid), False)
    c2w.on_chunk(_codec("a", 0, 0, 1))
    c2w.on_chunk(_codec("b", 0, 0, 1))
    out = {e.request_id: [e.item.samples] for e in c2w.step()}  # a, b: first chunks together
    assert sorted(out) == ["a", "b"]
    c2w.on_chunk(_codec("a", 1, 1, 25, finished=True))
    c2w.on_chunk(_codec("c", 0, 0, 1))
    c2w.on_chunk(_codec("b", 1, 1, 25, finished=True))
    c2w.on_chunk(_codec("c", 1, 1, 2, finished=True))  # c's second chunk before its first left
    steps = []
    while c2w.has_work():
        emits = c2w.step()
        steps.append([(e.request_id, e.item.seq) for e in emits])
        for e in emits:
            out.setdefault(e.request_id, []).append(e.item.samples)
    if first_chunks_first:  # c's first chunk alone, then everyone's next (no one is late)
        assert steps == [[("c", 0)], [("c", 1), ("a", 1), ("b", 1)]]
    else:  # arrival order: round 0 (a, c, b), then c's second
        assert steps == [[("a", 1), ("c", 0), ("b", 1)], [("c", 1)]]
    assert [x.numel() for x in out["c"]] == [SAMPLES_PER_FRAME, 2 * SAMPLES_PER_FRAME]
    assert torch.cat(out["a"]).tolist() == [1.0] * SAMPLES_PER_FRAME + [2.0] * 25 * SAMPLES_PER_FRAME
    assert c2w.request_ids() == [] and c2w.runner.num_requests == 0


@pytest.mark.parametrize("urgent_s,now,steps", [
    (2.0, 0.5, [["b"], ["a"]]),      # b's audio plays out at 1.0 s, within 2 s of 0.5: first
    (0.0, 0.5, [["a", "b"]]),        # 0: only the late go first, and b is not late yet
    (0.0, 1.5, [["b"], ["a"]]),      # ... now it is: its audio ran out at 1.0 s
    (30.0, 0.5, [["a", "b"]]),       # both due within 30 s: no one to skip
])
def test_a_stream_about_to_run_dry_is_decoded_before_streams_with_audio_in_hand(urgent_s, now,
                                                                                 steps):
    """``urgent_s``: after first chunks, the requests whose audio out plays out within
    ``urgent_s`` of now (a player starting at the first audio; one frame here lasts 1 s) get a
    step before those with audio in hand; every request's audio is the same in any order."""
    clock = [0.0]
    c2w = Code2WavLogic(FakeCode2Wav(), sample_rate=SAMPLES_PER_FRAME, urgent_s=urgent_s,
                        clock=lambda: clock[0], max_batch=4)
    out = {}

    def drain():
        done = []
        while c2w.has_work():
            emits = c2w.step()
            done.append(sorted({e.request_id for e in emits}))
            for e in emits:
                out.setdefault(e.request_id, []).append(e.item.samples)
        return done

    for rid in "ab":
        c2w.add(req(rid), False)
        c2w.on_chunk(_codec(rid, 0, 0, 1))
    assert drain() == [["a", "b"]]  # both play out at 1.0 s
    c2w.on_chunk(_codec("a", 1, 1, 25))
    assert drain() == [["a"]]  # a: 26 s of audio out
    clock[0] = now
    c2w.on_chunk(_codec("a", 2, 26, 25, finished=True))
    c2w.on_chunk(_codec("b", 1, 1, 2, finished=True))
    assert drain() == steps
    assert torch.cat(out["b"]).tolist() == [1.0] * SAMPLES_PER_FRAME + [2.0] * 2 * SAMPLES_PER_FRAME
    assert torch.cat(out["a"]).tolist() == ([1.0] * SAMPLES_PER_FRAME
                                            + [2.0] * 25 * SAMPLES_PER_FRAME
                                            + [3.0] * 25 * SAMPLES_PER_FRAME)
    assert c2w.request_ids() == [] and c2w._plays_out == {}


def test_urgent_ms_changes_live_for_the_next_step():
    """``code2wav_urgent_ms`` is a live field (``POST /debug/pipeline``): ``tune`` changes
    which pending chunk goes first at the next step, on the running logic."""
    from omni_ray.config.pipeline import PipelineConfig

    clock = [0.0]
    c2w = Code2WavLogic(FakeCode2Wav(), sample_rate=SAMPLES_PER_FRAME, clock=lambda: clock[0],
                        max_batch=4)
    for rid in "ab":
        c2w.add(req(rid), False)
        c2w.on_chunk(_codec(rid, 0, 0, 1))
    while c2w.has_work():
        c2w.step()
    c2w.on_chunk(_codec("a", 1, 1, 25))
    c2w.step()  # a: 26 s of audio out, b: 1 s
    clock[0] = 0.5
    c2w.on_chunk(_codec("a", 2, 26, 25, finished=True))
    c2w.on_chunk(_codec("b", 1, 1, 2, finished=True))
    c2w.tune(PipelineConfig(code2wav_urgent_ms=2000))  # b plays out within 2 s: b first
    assert [e.request_id for e in c2w.step()] == ["b"]
    c2w.tune(PipelineConfig())  # back to 0 (nothing late): the rest in one round
    assert [e.request_id for e in c2w.step()] == ["a"]


def test_a_late_streams_player_restarts_at_its_late_audio():
    """The player waits when the next piece is late, then plays it whole: a stream whose audio
    ran out at 1 s and got a frame (1 s) at 5 s plays out at 6 s, so at 5.5 s it is not late
    and its next chunk waits its turn behind a first come ``a``."""
    clock = [0.0]
    c2w = Code2WavLogic(FakeCode2Wav(), sample_rate=SAMPLES_PER_FRAME, clock=lambda: clock[0],
                        max_batch=4)
    for rid in "ab":
        c2w.add(req(rid), False)
    c2w.on_chunk(_codec("b", 0, 0, 1))
    c2w.step()
    clock[0] = 5.0
    c2w.on_chunk(_codec("b", 1, 1, 1))
    c2w.step()
    clock[0] = 5.5
    c2w.on_chunk(_codec("a", 0, 0, 1))
    c2w.on_chunk(_codec("a", 1, 1, 1))
    c2w.step()  # a's first chunk alone, then its next
    c2w.step()
    c2w.on_chunk(_codec("b", 2, 2, 1))
    c2w.on_chunk(_codec("a", 2, 2, 1))
    assert [e.request_id for e in c2w.step()] == ["b", "a"]  # one step: neither is late


def test_code2wav_batches_one_chunk_per_request_per_forward_and_a_failure_stays_its_own():
    """``max_batch``: a step's chunks decode in rounds (each request's r-th chunk in round r),
    split into forwards of at most ``max_batch`` requests; each request's audio is what it gets
    unbatched, and a request that fails in a shared forward fails alone."""
    def run(max_batch, fail=()):
        c2w = Code2WavLogic(FakeCode2Wav(), first_chunks_first=False, max_batch=max_batch,
                            clock=lambda: 0.0)
        c2w.runner.fail.update(fail)
        for rid in "abc":
            c2w.add(req(rid), False)
        for rid in "abc":
            c2w.on_chunk(_codec(rid, 0, 0, 2))
        c2w.on_chunk(_codec("a", 1, 2, 3, finished=True))
        c2w.on_chunk(_codec("b", 1, 2, 1, finished=True))
        out, errors = {}, {}
        while c2w.has_work():
            for e in c2w.step():
                if e.error:
                    errors[e.request_id] = e.error
                else:
                    out.setdefault(e.request_id, []).append(e.item)
        return c2w, out, errors

    one, alone, _ = run(1)
    assert one.runner.batches == [["a"], ["b"], ["c"], ["a"], ["b"]]
    two, batched, _ = run(2)  # a step is one forward; the next takes the first pending of each
    assert two.runner.batches == [["a", "b"], ["c", "a"], ["b"]]
    for rid in "ab":
        assert [(a.seq, a.start_sample, a.finished) for a in batched[rid]] == \
            [(a.seq, a.start_sample, a.finished) for a in alone[rid]]
        assert torch.equal(torch.cat([a.samples for a in batched[rid]]),
                           torch.cat([a.samples for a in alone[rid]]))
    assert two.request_ids() == ["c"]  # c's stream is still open (no finished chunk yet)
    failed, out, errors = run(2, fail={"b"})
    assert errors == {"b": "RuntimeError: bad codes"}
    assert failed.runner.batches == [["a", "b"], ["c", "a"]]  # b's later chunk is dropped
    assert torch.equal(torch.cat([a.samples for a in out["a"]]),
                       torch.cat([a.samples for a in alone["a"]]))


@pytest.mark.parametrize("dtype, setting, want", [
    ("float32", None, 1), ("bfloat16", None, 32), ("float16", None, 32),
    ("float32", 8, 8), ("bfloat16", 1, 1)])
def test_code2wav_batch_default_follows_the_dtype(dtype, setting, want):
    """Unset ``code2wav_max_batch``: batched forwards where the vocoder runs in bf16/fp16, one
    request a forward in float32 (the exact reference: a batched forward rounds differently, so
    a request's audio would depend on its neighbours); a set value wins. ``wrap_runner`` asks the
    runner for its dtype."""
    from omni_ray.pipeline.build import wrap_runner

    pipeline = PipelineConfig(code2wav_max_batch=setting)
    assert pipeline.code2wav_batch(dtype) == want
    runner = FakeCode2Wav()
    runner.dtype = dtype
    assert wrap_runner("code2wav", runner, pipeline).max_batch == want


# -- the disaggregated thinker (pipeline/kv.py) ------------------------------------------------
def _drain(logic) -> list[tuple]:
    out = []
    while logic.has_work():
        out += [(e.target, type(e.item).__name__, e.item.seq, e.item.token_ids, e.final,
                 getattr(e.item, "prompt_token_ids", None)) for e in logic.step()]
    return out


def test_a_prefilled_request_decodes_as_the_unsplit_thinker_would():
    cfg = PipelineConfig()
    r = req("a", 3, tokens=4)
    prefill = PrefillLogic(FakeThinker())
    assert prefill.prefill(r) == 300
    with pytest.raises(ValueError, match="duplicate"):
        prefill.prefill(r)
    chunk = prefill.extract("a")
    assert prefill.release("a") and not prefill.release("a") and prefill.request_ids() == []
    decode = DecodeThinkerLogic(FakeThinker(), cfg)
    decode.add_prefilled(r, True, chunk)
    whole = ThinkerLogic(FakeThinker(), cfg)
    whole.add(r, True)
    assert _drain(decode) == _drain(whole)
    assert decode.request_ids() == [] and decode.runner.num_requests == 0


def test_a_failed_kv_load_leaves_nothing_behind():
    decode = DecodeThinkerLogic(FakeThinker(), PipelineConfig())
    prefill = PrefillLogic(FakeThinker())
    prefill.prefill(req("other", 5))
    wrong = prefill.extract("other")
    with pytest.raises(KVLoadError, match="does not match"):
        decode.add_prefilled(req("a", 3), True, wrong)
    wrong.request_id = "a"  # same id and length, another prompt: the runner refuses it
    with pytest.raises(KVLoadError, match="another prompt"):
        decode.add_prefilled(req("a", 3), True, wrong)
    with pytest.raises(KVLoadError, match="injected"):
        decode.add_prefilled(req("a", 5), True, wrong, fail=True)
    assert decode.request_ids() == [] and decode.runner.num_requests == 0


def test_the_core_runs_without_ray():
    import subprocess
    import sys

    code = ("import sys, omni_ray.pipeline.local, omni_ray.pipeline.build, omni_ray.pipeline.kv;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'transformers', 'vllm')];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("above, held", [(0, ""), (2, "abcd"), (4, "")])
def test_first_chunks_made_under_load_wait_for_their_second(above, held):
    """``hold_first_chunk_above``: a first chunk made while the talker has more than that many
    requests goes together with the request's second chunk (one step's emits); the answers are
    the same chunks and audio as without it; a live change (``tune``) takes at the next first
    chunk. Here a and b start, c and d join before a's first chunk is made, and e starts
    alone once they are done."""
    reqs = [req(rid, i + 1, tokens=8) for i, rid in enumerate("abcde")]
    want = {r.request.request_id: r for r in Run(ramp_chunks=True).local.run(reqs)}
    run = Run(ramp_chunks=True)  # chunks of 2, 2, 3, 3, ... frames
    talker = run.logics[1]
    talker.tune(run.pipeline_cfg.tuned({"hold_first_chunk_above": above}))
    run.local.add(reqs[0])
    run.local.add(reqs[1])
    steps = []  # the talker's emits to code2wav, a step each

    def until_done():
        while not run.local.all_done():
            if run.talker.seqs.get("a", {}).get("n") == 1 and "c" not in run.local.results:
                run.local.add(reqs[2])  # a has 1 of its first chunk's 2 frames
                run.local.add(reqs[3])
            n = len(run.emits)
            assert run.local.step()
            steps.append([e for stage, e in run.emits[n:]
                          if stage == "talker" and e.target == "down"])

    until_done()
    run.local.add(reqs[4])
    until_done()
    for rid in "abcde":
        got = run.local.pop(rid)
        assert got.text_ids == want[rid].text_ids
        assert torch.equal(torch.cat(got.audio), torch.cat(want[rid].audio))
    paired = ""  # the requests whose first chunk left in the same step as their second
    for rid in "abcde":
        (first,) = [[e.item.seq for e in st if e.request_id == rid] for st in steps
                    if any(e.request_id == rid and e.item.seq == 0 for e in st)]
        paired += rid if first[:2] == [0, 1] else ""
    assert paired == held and talker.counters()["first_chunks_held"] == len(held)
    run.assert_clean()


def test_holding_a_first_chunk_needs_the_ramp():
    """Without ``ramp_chunks`` the second chunk is ``chunk_frames`` long: holding the first for
    it would cost that much first audio, so the config refuses it, naming the field."""
    with pytest.raises(ValidationError, match="hold_first_chunk_above\n.*needs ramp_chunks"):
        PipelineConfig(hold_first_chunk_above=8)
    with pytest.raises(ValidationError, match="hold_first_chunk_above"):
        PipelineConfig().tuned({"hold_first_chunk_above": 8})
    assert PipelineConfig(ramp_chunks=True).tuned(
        {"hold_first_chunk_above": 8}).hold_first_chunk_above == 8
