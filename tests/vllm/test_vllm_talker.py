"""Tests for the vLLM talker (omni_ray/runners/vllm/talker.py, omni_ray/models/vllm_talker.py).

Oracle: the transformers talker (``TalkerRunner``) and the transformers pipeline on the same
tiny checkpoint, greedy. Two vLLM talker engines start here (~5-15 s each on CPU): one in a
mixed pipeline (transformers thinker), one in an all-vLLM pipeline.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from vllm_helpers import (SMALL_ENGINE, VLLM_TESTS, assert_same_answers, idle_runner,
                          media_requests, pipeline_run, text_requests)

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root holds benchmarks/
pytestmark = VLLM_TESTS
GREEDY = SamplingParams()
ENGINE_KWARGS = SMALL_ENGINE
@pytest.fixture(scope="module")
def hf_omni(tiny_model_dir):
    from omni_ray.offline import Omni

    return Omni(tiny_model_dir, mode="sync")


@pytest.fixture(scope="module")
def mixed_omni(tiny_model_dir):
    """transformers thinker, vLLM talker."""
    from omni_ray.offline import Omni

    omni = Omni(tiny_model_dir, mode="sync", talker_backend="vllm",
                talker_engine_kwargs=ENGINE_KWARGS)
    yield omni
    omni.shutdown()


@pytest.fixture
def talker(mixed_omni):
    runner = mixed_omni.talker
    yield from idle_runner(runner)
    runner.engine.engine_core.engine_core.scheduler.omni_ready = runner._bridge.ready


@pytest.fixture(scope="module")
def hf_talker(tiny_model_dir):
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.runners.factory import make_runner, stage_config

    return make_runner("talker", tiny_model_dir, stage_config("talker"), pipeline=PipelineConfig())


@pytest.fixture(scope="module")
def thinker_out(hf_omni):
    """Prompt and thinker text of each SPECS request (transformers thinker)."""
    reqs = text_requests(hf_omni)
    outs = pipeline_run(hf_omni, "sync")
    return [(r.request_id, r.prompt_token_ids, o.text_token_ids, r.max_audio_frames)
            for r, o in zip(reqs, outs)]


def _drive(runner, feeds, steps_between=0, params=GREEDY, first_at=None):
    """Run ``feeds`` [(rid, prompt, text, max_frames)] to the end; text arrives one token per
    ``steps_between`` steps when that is > 0 (the thinker behind the talker). ``first_at``: a
    dict to fill with the step each request's first frame came out of."""
    for rid, prompt, text, frames in feeds:
        runner.add_request(rid, "ethan", params, frames)
        first = text[:1] if steps_between else text
        runner.push_text(rid, first, not steps_between or len(text) == 1,
                         prompt_token_ids=prompt)
    sent = {rid: (1 if steps_between else len(text)) for rid, _, text, _ in feeds}
    got = {rid: [] for rid, *_ in feeds}
    done = {}
    step = 0
    while runner.has_unfinished():
        for o in runner.step():
            got[o.request_id].append(o.frames)
            if first_at is not None and o.frames.shape[0]:
                first_at.setdefault(o.request_id, step)
            if o.finished:
                done[o.request_id] = (o.finish_reason, o.error)
        step += 1
        if steps_between and step % steps_between == 0:
            for rid, _, text, _ in feeds:
                if rid not in done and sent[rid] < len(text):
                    runner.push_text(rid, text[sent[rid]:sent[rid] + 1], sent[rid] + 1 == len(text))
                    sent[rid] += 1
        assert step < 2000, "talker did not finish"
    return {rid: torch.cat(f) if f else torch.empty(0, 16, dtype=torch.long)
            for rid, f in got.items()}, done


def _drive_as(runner, ref_runner, feeds, steps_between=0, params=GREEDY):
    """``_drive`` ``runner`` and ``ref_runner`` (all text known) on ``feeds``: the same finish
    reasons and frames, request by request; ``runner``'s (frames, finish reasons, the
    reference's)."""
    ref, ref_done = _drive(ref_runner, feeds, params=params)
    got, done = _drive(runner, feeds, steps_between, params=params)
    assert done == ref_done, (steps_between, params)
    for rid in ref:
        assert torch.equal(got[rid], ref[rid]), (steps_between, params, rid)
    return got, done, ref_done


# -- the whole pipeline ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
def test_mixed_pipeline_equals_transformers(hf_omni, mixed_omni, mode):
    """transformers thinker + vLLM talker + code2wav == the transformers pipeline: same text,
    same codec frames, same audio, four requests decoded together."""
    assert_same_answers(pipeline_run(hf_omni, mode), pipeline_run(mixed_omni, mode))


# -- the runner --------------------------------------------------------------------------------
def test_runner_frames_equal_transformers_talker(talker, hf_talker, thinker_out):
    """All requests at once, all text known: frames and finish reasons == TalkerRunner's."""
    ref, ref_done = _drive(hf_talker, thinker_out)
    before = dict(talker.time_spent)
    got, done = _drive(talker, thinker_out)
    assert done == ref_done
    spent = {k: v - before[k] for k, v in talker.time_spent.items()}  # the step profile's clocks
    assert spent["frames"] == sum(f.shape[0] for f in got.values())
    assert spent["prefills"] == len(got)
    assert spent["engine_s"] >= spent["code_predictor_s"] + spent["text_s"] + spent["logits_s"] > 0
    assert spent["admit_s"] >= spent["admit_copy_s"] > 0
    # what the scheduler gave the steps (the step records' sched_*): each request new once,
    # its prompt in rows of many tokens, then one row per code sampled after the first
    frames = spent["frames"]
    assert spent["sched_new"] == len(got) and spent["sched_held"] == 0
    assert spent["sched_prompt_tokens"] > 2 * len(got)
    decode_rows = spent["sched_tokens"] - spent["sched_prompt_tokens"]
    assert frames - len(got) <= decode_rows <= frames + len(got), (decode_rows, frames)
    for rid in ref:
        assert torch.equal(got[rid], ref[rid]), rid
    assert any(r == FinishReason.LENGTH for r, _ in done.values())


def test_a_prefill_that_cannot_be_built_fails_that_request_only(talker, hf_talker, thinker_out):
    """Admitted in the same step as the others (one host copy for all): a prompt with an audio
    placeholder but no hidden states fails alone; the others' frames == TalkerRunner's."""
    from omni_ray.runners.transformers.talker_inputs import user_positions

    rid, prompt, text, frames = thinker_out[0]
    bad = list(prompt)
    bad[user_positions(bad, talker.cfg)[3]] = talker.cfg.thinker_config.audio_token_id  # text
    ref, _ = _drive(hf_talker, thinker_out)
    got, done = _drive(talker, [*thinker_out, ("bad", bad, text, frames)])
    assert done["bad"] == (FinishReason.ERROR,
                           "ValueError: bad: multimodal prompt without hidden states")
    assert got["bad"].shape[0] == 0
    for rid in ref:
        assert torch.equal(got[rid], ref[rid]), rid
    assert not talker._seqs and not talker._internal


def test_repetition_penalty_equals_transformers_talker(talker, hf_talker, thinker_out):
    """Greedy with a repetition penalty: the vLLM talker's batched penalty (a seen-code mask per
    request, kept on the device) picks the same frames as transformers' rule in TalkerRunner,
    all requests in one batch; and the penalty does change them (the test can fail)."""
    penalized = SamplingParams(repetition_penalty=1.3)
    ref, ref_done = _drive(hf_talker, thinker_out, params=penalized)
    got, done = _drive(talker, thinker_out, params=penalized)
    assert done == ref_done
    for rid in ref:
        assert torch.equal(got[rid], ref[rid]), rid
    plain, _ = _drive(hf_talker, thinker_out)
    assert any(not torch.equal(plain[rid], ref[rid]) for rid in ref)


def test_ignore_eos_runs_the_audio_to_max_frames_as_transformers(talker, hf_talker, thinker_out):
    """``ignore_eos``: codebook 0 never takes the codec end, so every request's audio runs to
    its max_audio_frames, the vLLM talker's frames equal TalkerRunner's; without it, one of
    these requests ends its audio early (the test can fail)."""
    plain = SamplingParams(repetition_penalty=1.05)  # the talker's default
    _, plain_done = _drive(hf_talker, thinker_out, params=plain)
    assert any(r == FinishReason.STOP for r, _ in plain_done.values())
    no_eos = plain.model_copy(update={"ignore_eos": True})
    ref, ref_done = _drive(hf_talker, thinker_out, params=no_eos)
    got, done = _drive(talker, thinker_out, params=no_eos)
    assert done == ref_done
    for rid, _, _, frames in thinker_out:
        assert done[rid] == (FinishReason.LENGTH, None), rid
        assert got[rid].shape[0] == frames and torch.equal(got[rid], ref[rid]), rid


def test_waits_for_text_and_never_decodes_without_it(talker, hf_talker, thinker_out):
    """The thinker delivers one token every 3 talker steps: the talker waits (no frame, no
    error) while the next text is unknown, and the frames equal the all-at-once ones."""
    feeds = [f for f in thinker_out if len(f[2]) > 5]
    ref, _ = _drive(hf_talker, feeds)
    scheduler = talker.engine.engine_core.engine_core.scheduler
    held = []
    original = scheduler.omni_ready
    scheduler.omni_ready = lambda r: held.append(not original(r)) or original(r)
    before = talker.time_spent["sched_held"]
    got, done = _drive(talker, feeds, steps_between=3)
    assert any(held), "the scheduler never had to hold a request back"
    assert talker.time_spent["sched_held"] - before == sum(held)  # counted as it held them
    assert all(err is None for _, err in done.values()), done
    for rid in ref:
        assert torch.equal(got[rid], ref[rid]), rid


def test_scheduling_without_text_fails_loudly(talker, hf_talker, thinker_out):
    """Negative control: with the scheduler's guard off, the request whose text is missing is
    scheduled, and it fails with an error (it is not decoded on nothing); the other request,
    whose text is all there, is untouched."""
    _without_the_text_guard(talker, hf_talker, thinker_out)


def _without_the_text_guard(runner, hf_talker, thinker_out) -> None:
    (rid_a, prompt_a, text_a, frames_a), (rid_b, prompt_b, text_b, frames_b) = thinker_out[1:3]
    ref, _ = _drive(hf_talker, [(rid_a, prompt_a, text_a, frames_a)])
    scheduler = runner.engine.engine_core.engine_core.scheduler
    guard, scheduler.omni_ready = scheduler.omni_ready, None
    try:
        runner.add_request(rid_a, "ethan", GREEDY, frames_a)
        runner.push_text(rid_a, text_a, True, prompt_token_ids=prompt_a)
        runner.add_request(rid_b, "ethan", GREEDY, frames_b)
        runner.push_text(rid_b, text_b[:2], False, prompt_token_ids=prompt_b)  # thinker stalls
        got, done = {rid_a: [], rid_b: []}, {}
        while runner.has_unfinished():
            for o in runner.step():
                got[o.request_id].append(o.frames)
                if o.finished:
                    done[o.request_id] = (o.finish_reason, o.error)
    finally:
        scheduler.omni_ready = guard
    assert done[rid_b][0] == FinishReason.ERROR
    assert "trailing text" in done[rid_b][1] and "not available" in done[rid_b][1]
    assert done[rid_a][1] is None
    assert torch.equal(torch.cat(got[rid_a]), ref[rid_a])
    assert not runner._bridge.seqs and not runner.engine.has_unfinished_requests()


def _abort_after_frames(runner, feed, frames_out: int = 3) -> None:
    """Start ``feed`` (rid, prompt, text, max_frames), step until it has made ``frames_out``
    frames, abort it: the runner keeps nothing of it."""
    rid, prompt, text, frames = feed
    runner.add_request(rid, "ethan", GREEDY, frames)
    runner.push_text(rid, text, True, prompt_token_ids=prompt)
    produced = 0
    while produced < frames_out:
        produced += sum(o.frames.shape[0] for o in runner.step())
    assert runner.abort(rid)
    assert not runner.has_unfinished() and not runner._bridge.seqs
    assert not runner._bridge.early and not runner._bridge.unmarked


def test_abort_mid_stream_leaves_nothing(talker, thinker_out):
    rid = thinker_out[2][0]
    _abort_after_frames(talker, thinker_out[2])
    assert not talker.engine.has_unfinished_requests()
    assert not talker.abort(rid)


@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
def test_media_prompts_equal_transformers(hf_omni, mixed_omni, mode):
    """Audio / image prompts: the vLLM talker gets the prompt's 3-D positions and decode offset
    through the model runner hook, and speaks exactly like the transformers talker."""
    for omni in (hf_omni, mixed_omni):
        omni.pipeline = omni.pipeline.model_copy(update={"mode": mode})
    ref = hf_omni.generate(media_requests(hf_omni))
    got = mixed_omni.generate(media_requests(mixed_omni))
    assert all(o.error is None and o.codec_frames.shape[0] > 0 for o in got)
    assert_same_answers(ref, got)
    assert not mixed_omni.talker._bridge.positions  # every hand-over was taken


def test_media_positions_are_used(hf_omni, mixed_omni, monkeypatch):
    """Negative control: with text-only positions (the hook bypassed) the frames differ."""
    mixed_omni.pipeline = mixed_omni.pipeline.model_copy(update={"mode": "sync"})
    hf_omni.pipeline = hf_omni.pipeline.model_copy(update={"mode": "sync"})
    ref = hf_omni.generate(media_requests(hf_omni)[2:3])  # audio + image
    monkeypatch.setattr(mixed_omni.talker.inputs, "mm_positions", lambda seq, n: None)
    got = mixed_omni.generate(media_requests(mixed_omni)[2:3])
    assert got[0].text_token_ids == ref[0].text_token_ids
    assert not torch.equal(got[0].codec_frames, ref[0].codec_frames)


def test_sampling_gives_codec_ids_only(talker, thinker_out):
    """Sampled (temperature, top-k, repetition penalty): codebook 0 never takes a suppressed
    id, every code is in its codebook's range, and the run is reproducible with a seed."""
    rid, prompt, text, frames = thinker_out[2]
    params = SamplingParams(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05,
                            seed=7)

    def run(i):
        talker.add_request(f"{rid}-{i}", "ethan", params, frames)
        talker.push_text(f"{rid}-{i}", text, True, prompt_token_ids=prompt)
        out = []
        while talker.has_unfinished():
            out += [o.frames for o in talker.step()]
        return torch.cat(out)

    a, b = run(0), run(1)
    vocab = talker.cfg.talker_config.text_config.vocab_size
    assert a.shape[0] > 0 and int(a[:, 0].max()) < vocab - 1024
    assert int(a[:, 1:].max()) < talker.cfg.talker_config.code_predictor_config.vocab_size
    assert torch.equal(a, b)


def test_registered_through_vllms_plugin_entry_point():
    """pyproject names omni_ray's register() under vllm.general_plugins; vLLM's own plugin
    loader then knows the talker architecture."""
    from importlib.metadata import entry_points

    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    from omni_ray.models.vllm_plugin import TALKER_ARCHITECTURE

    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("omni_ray") == "omni_ray.models.vllm_plugin:register"
    load_general_plugins()
    assert TALKER_ARCHITECTURE in ModelRegistry.get_supported_archs()


def test_kernel_warmup_goes_through_the_bridge_and_changes_no_frame(talker, hf_talker,
                                                                    thinker_out):
    """The talker's warm-up forwards (run at start on a GPU) carry no request of ours: the
    bridge lets them through, and the frames afterwards are still transformers' own."""
    from omni_ray.runners.vllm.kernel_warmup import warm_kernels

    assert warm_kernels(talker.engine, "talker") is not None, "the warm-up failed (see the log)"
    ref, _ = _drive(hf_talker, thinker_out)
    got, _ = _drive(talker, thinker_out)
    for rid in ref:
        assert torch.equal(got[rid], ref[rid]), rid


def test_all_vllm_pipeline_equals_transformers(hf_omni, tiny_model_dir):
    """Thinker and talker both on vLLM (two engines in one process), both modes. Last in this
    file: engines in one process share vLLM's process-wide parallel state, which the first
    shutdown tears down for all of them (``Omni.shutdown`` stops them together)."""
    from omni_ray.offline import Omni

    omni = Omni(tiny_model_dir, mode="sync", thinker_backend="vllm", talker_backend="vllm",
                thinker_engine_kwargs=ENGINE_KWARGS, talker_engine_kwargs=ENGINE_KWARGS)
    try:
        for mode in ("sync", "async_chunk"):
            assert_same_answers(pipeline_run(hf_omni, mode), pipeline_run(omni, mode))
    finally:
        omni.shutdown()


# -- the code predictor behind the sampler -----------------------------------------------------
@pytest.fixture(scope="module")
def batched_talker(tiny_model_dir):
    """A vLLM talker with the batched code predictor (the default), which runs it right
    behind vLLM's sampler."""
    from omni_ray.models.loading import load_stage
    from omni_ray.runners.vllm.engine_args import CPU_ENGINE_DEFAULTS
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    tk = load_stage(tiny_model_dir, "talker", "cpu", torch.float32)
    runner = VllmTalkerRunner(tiny_model_dir, tk.module, tk.text_embedding, tk.config,
                              batch_code_predictor=True,
                              engine_kwargs={**CPU_ENGINE_DEFAULTS, **ENGINE_KWARGS})
    yield runner
    runner.shutdown()


def _early_equals_late(runner, thinker_out, steps_between):
    """Frames with the code predictor behind the sampler == with it in the next step's input;
    every frame came from behind the sampler, a request's first a step sooner (or more, when
    the next text token is late); nothing is left kept afterwards."""
    hook = runner._bridge._sampler_hook
    assert hook is not None
    late_first, early_first = {}, {}
    hook._on = False
    late, late_done = _drive(runner, thinker_out, steps_between, first_at=late_first)
    hook._on = True
    before = dict(runner.time_spent)
    early, early_done = _drive(runner, thinker_out, steps_between, first_at=early_first)
    assert early_done == late_done
    for rid in late:
        assert torch.equal(early[rid], late[rid]), (steps_between, rid)
    made = sum(f.shape[0] for f in early.values())
    assert runner.time_spent["early_frames"] - before["early_frames"] == made
    assert runner.time_spent["frames"] - before["frames"] == made
    # the late path made the first frame inside the next decode step, which waits for the next
    # text token; behind the sampler it needs none
    assert set(early_first) == set(late_first)
    assert all(early_first[r] <= late_first[r] - 1 for r in late_first), (early_first, late_first)
    if not steps_between:
        assert early_first == {rid: step - 1 for rid, step in late_first.items()}
    assert not runner._bridge.early


@pytest.mark.parametrize("steps_between", [0, 3])
def test_code_predictor_behind_the_sampler_changes_no_frame(batched_talker, thinker_out,
                                                            steps_between):
    """Requests in lockstep (all text known) and with the text trickling in (a token every 3
    steps: requests wait with a result kept)."""
    _early_equals_late(batched_talker, thinker_out, steps_between)


def test_a_decode_steps_inputs_take_one_add_for_the_batch_not_one_per_row(batched_talker,
                                                                           thinker_out):
    """The bridge adds the text part to the codes' embeddings of a decode step's rows in one
    operator for the batch, not one per row (each is a launch on a GPU; the talker's ``text_s``
    was 4.5 ms a step at 28 rows on the H200, session 15). Counted on the steps whose rows all
    came from behind the sampler (no code predictor inside), as requests finish and the batch
    shrinks from 4 rows to 1."""
    from benchmarks.op_count import OpCount  # the repo root: on sys.path above

    bridge = batched_talker._bridge
    inner = bridge.decode_embeds
    seen = {}

    def counted(input_ids, embed_codes):
        early = sum(1 for s in bridge.seqs.values() if s.request_id in bridge.early)
        with OpCount() as c:
            out = inner(input_ids, embed_codes)
        if early == out.shape[0]:  # every row's codes made behind the sampler
            seen.setdefault(out.shape[0], set()).add(c.by_op["add"])
        return out

    bridge.decode_embeds = counted
    try:
        _drive(batched_talker, thinker_out)
    finally:
        del bridge.decode_embeds
    assert {1, 4} <= set(seen), seen
    assert len(set().union(*seen.values())) == 1, seen


def test_abort_drops_the_kept_code_predictor_result(batched_talker, thinker_out):
    rid, prompt, text, frames = thinker_out[2]
    batched_talker.add_request(rid, "ethan", GREEDY, frames)
    batched_talker.push_text(rid, text, True, prompt_token_ids=prompt)
    for _ in range(4):
        batched_talker.step()
    assert rid in batched_talker._bridge.early  # the next frame, made behind the sampler
    batched_talker.abort(rid)
    assert not batched_talker._bridge.early and not batched_talker.has_unfinished()


# -- vLLM's async scheduling (engine_kwargs async_scheduling) -----------------------------------
@pytest.fixture(scope="module")
def async_talker(tiny_model_dir):
    """A vLLM talker on vLLM's async scheduler: step k+1 is scheduled and its inputs built
    before step k's codes reach the host (kept on here although vLLM's CPU platform turns it
    off)."""
    from omni_ray.models.loading import load_stage
    from omni_ray.models.vllm_talker import AsyncTalkerScheduler
    from omni_ray.runners.vllm.engine_args import CPU_ENGINE_DEFAULTS
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    tk = load_stage(tiny_model_dir, "talker", "cpu", torch.float32)
    runner = VllmTalkerRunner(tiny_model_dir, tk.module, tk.text_embedding, tk.config,
                              engine_kwargs={**CPU_ENGINE_DEFAULTS, **ENGINE_KWARGS,
                                             "async_scheduling": True})
    core = runner.engine.engine_core.engine_core
    assert runner.async_step and runner.engine.vllm_config.scheduler_config.async_scheduling
    assert core.batch_queue is not None and isinstance(core.scheduler, AsyncTalkerScheduler)
    yield from idle_runner(runner)
    runner.shutdown()


@pytest.mark.parametrize("steps_between", [0, 3])
def test_async_step_frames_equal_transformers_talker(async_talker, hf_talker, thinker_out,
                                                     steps_between):
    """Greedy, the talker's default penalty (1.05): the same frames and finish reasons as
    TalkerRunner, with the requests in lockstep and with the text trickling in (requests held
    while vLLM has a step in flight). Some answers end at the codec end, which vLLM reads a
    step late: the step it ran past it makes no frame. Afterwards nothing is kept."""
    before = dict(async_talker.time_spent)
    got, done, _ = _drive_as(async_talker, hf_talker, thinker_out, steps_between,
                             SamplingParams(repetition_penalty=1.05))
    assert any(r == FinishReason.STOP for r, _ in done.values())  # the codec end is met
    made = sum(f.shape[0] for f in got.values())
    assert async_talker.time_spent["frames"] - before["frames"] == made
    bridge = async_talker._bridge
    assert not bridge.early and not bridge.unmarked and not bridge.seqs


def test_async_step_repetition_penalty_and_ignore_eos_equal_transformers(async_talker,
                                                                          hf_talker, thinker_out):
    """The penalty's seen codes, marked on the device from the sampler's codes (the host learns
    them a step late), pick TalkerRunner's frames; and with ``ignore_eos`` every answer runs
    to its max_audio_frames, no frame more (vLLM schedules no step past max_tokens)."""
    for params in (SamplingParams(repetition_penalty=1.3),
                   SamplingParams(repetition_penalty=1.05, ignore_eos=True)):
        got, _, _ = _drive_as(async_talker, hf_talker, thinker_out, params=params)
    for rid, _, _, frames in thinker_out:
        assert got[rid].shape[0] == frames


def test_async_step_abort_mid_stream_leaves_nothing(async_talker, hf_talker, thinker_out):
    """An abort with a step in flight: vLLM's next output for it is dropped, nothing is kept,
    and the next request's frames are TalkerRunner's."""
    _abort_after_frames(async_talker, thinker_out[2])
    _drive_as(async_talker, hf_talker, [thinker_out[1]])


def test_async_step_scheduling_without_text_fails_loudly(async_talker, hf_talker, thinker_out):
    """The same negative control on vLLM's async scheduler: a request scheduled without its
    next text fails with an error, the other's frames are TalkerRunner's."""
    _without_the_text_guard(async_talker, hf_talker, thinker_out)


@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
def test_async_step_in_the_pipeline_equals_transformers(hf_omni, tiny_model_dir, mode):
    """transformers thinker + the vLLM talker on vLLM's async scheduler + code2wav == the
    transformers pipeline (text, frames, audio), with the thinker's text streamed to the
    talker chunk by chunk in async_chunk. (Its engine's shutdown resets vLLM's process-wide
    parallel groups: the tests that step ``async_talker`` come before it.)"""
    from omni_ray.offline import Omni

    omni = Omni(tiny_model_dir, mode="sync", talker_backend="vllm",
                talker_engine_kwargs={**ENGINE_KWARGS, "async_scheduling": True})
    try:
        assert omni.talker.async_step
        assert_same_answers(pipeline_run(hf_omni, mode), pipeline_run(omni, mode))
    finally:
        omni.shutdown()


def test_async_step_needs_the_code_predictor_behind_the_sampler(tiny_model_dir):
    from omni_ray.models.loading import load_stage
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    tk = load_stage(tiny_model_dir, "talker", "cpu", torch.float32)
    with pytest.raises(ValueError, match="async_scheduling needs the batched code predictor"):
        VllmTalkerRunner(tiny_model_dir, tk.module, tk.text_embedding, tk.config,
                         early_code_predictor=False,
                         engine_kwargs={**ENGINE_KWARGS, "async_scheduling": True})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the code predictor's stream is CUDA's")
def test_code_predictor_on_its_stream_changes_no_frame_on_cuda(tiny_model_dir, thinker_out):
    """On CUDA (float32, the code predictor's CUDA graphs): run on a stream of its own behind
    vLLM's sampler, the frames == run in the next step's input on vLLM's stream, with the
    requests in lockstep and with the text trickling in. CI has no GPU: scripts/device's
    ``GPU_TESTS`` runs it by its node id."""
    from omni_ray.models.loading import load_stage
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    tk = load_stage(tiny_model_dir, "talker", "cuda", torch.float32)
    runner = VllmTalkerRunner(tiny_model_dir, tk.module, tk.text_embedding, tk.config,
                              device="cuda", enforce_eager=True, gpu_memory_utilization=0.1,
                              engine_kwargs=dict(ENGINE_KWARGS))
    try:
        assert runner.inputs.cp_graphs is not None
        for steps_between in (0, 3):
            _early_equals_late(runner, thinker_out, steps_between)
    finally:
        runner.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams and graphs")
def test_async_step_on_cuda_equals_the_sync_step(tiny_model_dir, thinker_out):
    """On CUDA (float32; the code predictor's CUDA graphs on its own stream behind the
    sampler, vLLM's async output copy): the talker on vLLM's async scheduler makes the frames
    of the synchronous one, in lockstep and with the text trickling in, with the default
    penalty (answers that end at the codec end included). CI has no GPU: scripts/device's
    ``GPU_TESTS`` runs it by its node id."""
    from omni_ray.models.loading import load_stage
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    params = SamplingParams(repetition_penalty=1.05)
    got = {}
    for async_step in (False, True):
        tk = load_stage(tiny_model_dir, "talker", "cuda", torch.float32)
        runner = VllmTalkerRunner(tiny_model_dir, tk.module, tk.text_embedding, tk.config,
                                  device="cuda", enforce_eager=True, gpu_memory_utilization=0.1,
                                  engine_kwargs={**ENGINE_KWARGS,
                                                 "async_scheduling": async_step})
        try:
            assert runner.async_step is async_step and runner.inputs.cp_graphs is not None
            got[async_step] = [_drive(runner, thinker_out, steps_between, params=params)
                               for steps_between in (0, 3)]
        finally:
            runner.shutdown()
    for (sync_frames, sync_done), (async_frames, async_done) in zip(got[False], got[True]):
        assert async_done == sync_done
        assert any(r == FinishReason.STOP for r, _ in sync_done.values())
        for rid in sync_frames:
            assert torch.equal(async_frames[rid], sync_frames[rid]), rid


def test_the_backbone_directory_is_the_checkpoints_own_on_every_start(talker, tiny_model_dir):
    """vLLM loads the talker from ``backbone_dir`` (kept per checkpoint), not a new temporary
    directory: its compile cache, keyed by that path, is the same on the next start."""
    from omni_ray.runners.vllm.talker_backbone import backbone_dir

    model_cfg = talker.engine.vllm_config.model_config
    assert model_cfg.model == str(talker.backbone_dir) == str(backbone_dir(tiny_model_dir))
    assert (talker.backbone_dir / "config.json").exists()  # shutdown() of others kept it


def test_prompts_prefilled_over_several_steps_give_the_same_frames(tiny_model_dir, hf_talker,
                                                                   thinker_out):
    """A token budget below the prompts' lengths (``max_num_batched_tokens``: vLLM's chunked
    prefill, what a serving config sets to keep admissions from stalling decodes): each prompt
    is prefilled over several steps, next to the others' decodes, and the frames == the
    transformers talker's, with all text known and with it trickling in."""
    from omni_ray.models.loading import load_stage
    from omni_ray.runners.vllm.engine_args import CPU_ENGINE_DEFAULTS
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    budget = 8  # vLLM's floor: max_num_seqs
    tk = load_stage(tiny_model_dir, "talker", "cpu", torch.float32)
    runner = VllmTalkerRunner(tiny_model_dir, tk.module, tk.text_embedding, tk.config,
                              engine_kwargs={**CPU_ENGINE_DEFAULTS, **ENGINE_KWARGS,
                                             "max_num_batched_tokens": budget})
    try:
        for steps_between in (0, 3):
            ref, ref_done = _drive(hf_talker, thinker_out, steps_between)
            before = dict(runner.time_spent)
            got, done = _drive(runner, thinker_out, steps_between)
            assert done == ref_done
            for rid in ref:
                assert torch.equal(got[rid], ref[rid]), (steps_between, rid)
            spent = {k: v - before[k] for k, v in runner.time_spent.items()}
            assert spent["sched_new"] == len(ref)
            # the prompts hold more tokens than a step may take: they were split over steps
            assert spent["sched_prompt_tokens"] > budget * len(ref)
    finally:
        runner.shutdown()
