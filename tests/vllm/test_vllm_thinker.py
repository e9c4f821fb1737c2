"""Tests for omni_ray/runners/vllm/thinker.py and the thinker backends in runners/factory.py.

One vLLM engine (started through ``Omni(..., thinker_backend="vllm")``, 5-30 s on CPU) serves
every test here; the oracle is the transformers ``ThinkerRunner`` on the same tiny checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import SMALL_ENGINE, VLLM_TESTS, idle_runner

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.config.sampling import SamplingParams
from omni_ray.config.serving import StageConfig
from omni_ray.payload import FinishReason
from omni_ray.runners.factory import make_runner, stage_config

pytestmark = VLLM_TESTS
GREEDY = SamplingParams()
ENGINE_KWARGS = {**SMALL_ENGINE, "kv_cache_memory_bytes": 128 << 20}
# The last prompt is longer than max_num_batched_tokens: vLLM prefills it in chunks over steps.
TEXTS = ["Hi", "Tell me a story about a cat and a dog who become friends.", "What is 2+2? " * 20,
         "Count: " + " ".join(str(i) for i in range(150))]


@pytest.fixture(scope="module")
def vllm_omni(tiny_model_dir):
    """The offline pipeline with a vLLM thinker (sync mode); its thinker is the shared engine."""
    pytest.importorskip("vllm")
    from omni_ray.offline import Omni

    omni = Omni(tiny_model_dir, mode="sync", thinker_backend="vllm",
                thinker_engine_kwargs=ENGINE_KWARGS)
    yield omni
    omni.thinker.shutdown()


@pytest.fixture
def vllm_runner(vllm_omni):
    yield from idle_runner(vllm_omni.thinker)


@pytest.fixture(scope="module")
def hf_runner(tiny_model_dir):
    return make_runner("thinker", tiny_model_dir, stage_config("thinker", dtype=torch.float32),
                       pipeline=PipelineConfig())


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    from omni_ray.models.tokenizer import encode_chat, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    out = [encode_chat(tok, [{"role": "user", "content": t}]) for t in TEXTS]
    assert len({len(p) for p in out}) == len(out)
    assert len(out[-1]) > ENGINE_KWARGS["max_num_batched_tokens"]
    return out


def run(runner, requests: dict[str, tuple]) -> tuple[dict, dict]:
    """Submit ``{id: (prompt, max_tokens, stop_ids)}`` together, step to the end."""
    for rid, (prompt, max_tokens, stop) in requests.items():
        runner.add_request(rid, prompt, GREEDY, max_tokens, stop)
    tokens = {rid: [] for rid in requests}
    reasons = {}
    while runner.has_unfinished():
        for out in runner.step():
            assert out.request_id not in reasons, "output after the request finished"
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    return tokens, reasons


# -- factory (no engine) ---------------------------------------------------------------------------
def test_unknown_backend_names_the_field():
    with pytest.raises(ValueError, match="thinker_backend.*'tensorrt'"):
        make_runner("thinker", "/nonexistent", StageConfig.model_construct(backend="tensorrt"),
                    pipeline=PipelineConfig())
    with pytest.raises(ValueError, match="thinker_backend.*'tensorrt'"):
        stage_config("thinker", "tensorrt")


def test_engine_kwargs_rejected_for_transformers():
    with pytest.raises(ValueError, match="thinker_engine_kwargs"):
        stage_config("thinker", "transformers", engine_kwargs={"max_model_len": 64})


# -- the vLLM runner against the transformers runner -------------------------------------------
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "alone"])
def test_greedy_tokens_match_transformers(vllm_runner, hf_runner, prompts, batched):
    reqs = {f"p{i}": (p, 12, None) for i, p in enumerate(prompts)}
    want, want_reasons = run(hf_runner, reqs)
    if batched:
        got, got_reasons = run(vllm_runner, reqs)
    else:
        got, got_reasons = {}, {}
        for rid, req in reqs.items():
            t, r = run(vllm_runner, {rid: req})
            got |= t
            got_reasons |= r
    assert got == want
    assert got_reasons == want_reasons == {rid: FinishReason.LENGTH for rid in reqs}


def test_max_tokens_and_stop_tokens_match(vllm_runner, hf_runner, prompts):
    free, _ = run(hf_runner, {"free": (prompts[1], 8, None)})
    stop_at = free["free"][4]  # the 5th greedy token becomes a stop token
    assert stop_at not in free["free"][:4]
    reqs = {"len1": (prompts[0], 1, None), "len3": (prompts[1], 3, None),
            "stop": (prompts[1], 8, [stop_at]), "stop_late": (prompts[2], 5, [stop_at])}
    want = run(hf_runner, reqs)
    got = run(vllm_runner, reqs)
    assert got == want
    tokens, reasons = got
    assert tokens["stop"] == free["free"][:5]  # the stop token is part of the output
    assert reasons["stop"] == FinishReason.STOP
    assert [len(tokens[r]) for r in ("len1", "len3")] == [1, 3]
    assert reasons["len1"] == reasons["len3"] == FinishReason.LENGTH


def test_ignore_eos_runs_past_the_end_ids_but_not_the_stop_ids(vllm_runner, hf_runner, prompts,
                                                                 monkeypatch):
    """``ignore_eos``: the runner's end ids (here the 5th greedy token) no longer end the
    answer, a request's own stop ids still do; both backends alike."""
    free, _ = run(hf_runner, {"free": (prompts[1], 8, None)})
    end = free["free"][4]
    assert end not in free["free"][:4]
    no_eos = SamplingParams(ignore_eos=True)
    for runner in (hf_runner, vllm_runner):
        monkeypatch.setattr(runner, "eos_token_ids", frozenset([end]))
        runner.add_request("ends", prompts[1], GREEDY, 8)
        runner.add_request("runs", prompts[1], no_eos, 8)
        runner.add_request("stops", prompts[1], no_eos, 8, [end])
        tokens, reasons = {}, {}
        while runner.has_unfinished():
            for out in runner.step():
                tokens[out.request_id] = tokens.get(out.request_id, []) + out.new_token_ids
                if out.finished:
                    reasons[out.request_id] = out.finish_reason
        assert tokens["ends"] == tokens["stops"] == free["free"][:5], type(runner).__name__
        assert reasons["ends"] == reasons["stops"] == FinishReason.STOP
        assert tokens["runs"] == free["free"] and reasons["runs"] == FinishReason.LENGTH


def test_abort_mid_generation(vllm_runner, hf_runner, prompts):
    want, _ = run(hf_runner, {"keep": (prompts[1], 10, None)})
    vllm_runner.add_request("keep", prompts[1], GREEDY, 10)
    vllm_runner.add_request("drop", prompts[2], GREEDY, 10)
    seen = {"keep": [], "drop": []}
    for _ in range(3):
        for out in vllm_runner.step():
            seen[out.request_id] += out.new_token_ids
    assert seen["drop"], "the aborted request should have started"
    assert vllm_runner.abort("drop") is True
    assert vllm_runner.abort("drop") is False
    assert vllm_runner.num_requests == 1 and vllm_runner.request_ids() == ["keep"]
    dropped_at = len(seen["drop"])
    while vllm_runner.has_unfinished():
        for out in vllm_runner.step():
            seen[out.request_id] += out.new_token_ids
    assert len(seen["drop"]) == dropped_at
    assert seen["keep"] == want["keep"]
    assert vllm_runner.num_requests == 0


def test_request_validation(vllm_runner, prompts):
    vllm_runner.add_request("dup", prompts[0], GREEDY, 2)
    with pytest.raises(ValueError, match="duplicate"):
        vllm_runner.add_request("dup", prompts[0], GREEDY, 2)
    with pytest.raises(ValueError, match="empty"):
        vllm_runner.add_request("empty", [], GREEDY, 2)
    with pytest.raises(ValueError, match="max_tokens"):
        vllm_runner.add_request("zero", prompts[0], GREEDY, 0)
    assert vllm_runner.request_ids() == ["dup"]


# -- the whole offline pipeline: vLLM thinker, transformers talker and code2wav ---------------
@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
def test_offline_pipeline_matches_transformers_backend(vllm_omni, tiny_model_dir, prompts, mode):
    from omni_ray.offline import Omni

    mixed = vllm_omni if mode == "sync" else Omni(tiny_model_dir, mode=mode,
                                                   thinker_runner=vllm_omni.thinker)
    reference = Omni(tiny_model_dir, mode=mode)  # transformers thinker
    reqs = [OmniRequest(request_id=f"r{i}", prompt_token_ids=p, max_tokens=6 + 2 * i,
                        max_audio_frames=10) for i, p in enumerate(prompts[1:])]
    got, want = mixed.generate(reqs), reference.generate(reqs)
    for g, w in zip(got, want):
        assert g.text_token_ids == w.text_token_ids
        assert g.finish_reason == w.finish_reason
        assert torch.equal(g.codec_frames, w.codec_frames)
        assert g.codec_frames.shape[0] > 0
        assert g.audio.shape == w.audio.shape
        peak = w.audio.abs().max().item()
        assert peak > 0
        assert (g.audio - w.audio).abs().max().item() <= 1e-5 * peak
    assert not vllm_omni.thinker.has_unfinished()


# -- audio / image prompts: vLLM's own processor and encoders, hidden states by the hook -----
def _media_messages(kind: str, seed: int = 0) -> list[dict]:
    from media_samples import audio_bytes, picture, tone

    from omni_ray.inputs.audio import decode_audio

    parts = []
    if kind in ("audio", "both"):
        parts.append({"type": "audio", "audio": decode_audio(audio_bytes(tone(1.5)), "wav",
                                                             max_seconds=10)})
    if kind in ("image", "both"):
        parts.append({"type": "image", "image": picture(96, 64, seed=seed)})
    return [{"role": "user", "content": parts + [{"type": "text", "text": "What?"}]}]


@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
@pytest.mark.parametrize("kind", ["audio", "both"])
def test_media_prompt_pipeline_matches_transformers_backend(vllm_omni, tiny_model_dir, kind,
                                                            mode):
    """Same text tokens, codec frames and waveform as the transformers thinker: the hook's
    hidden states reach the talker (the frames depend on them, tests/test_mm_oracle.py)."""
    from omni_ray.offline import Omni

    mixed = vllm_omni if mode == "sync" else Omni(tiny_model_dir, mode=mode,
                                                   thinker_runner=vllm_omni.thinker)
    reference = Omni(tiny_model_dir, mode=mode)
    msgs = _media_messages(kind)
    req = mixed.request(msgs, request_id=f"v-{kind}", max_tokens=10, max_audio_frames=30)
    assert req.mm.raw_audio is not None and req.mm.input_features is None  # vLLM processes
    (got,) = mixed.generate(req)
    (want,) = reference.generate(reference.request(msgs, request_id="t", max_tokens=10,
                                                   max_audio_frames=30))
    assert got.finish_reason != FinishReason.ERROR
    assert got.text_token_ids == want.text_token_ids
    assert torch.equal(got.codec_frames, want.codec_frames) and got.codec_frames.shape[0] > 0
    assert got.audio.shape == want.audio.shape
    assert (got.audio - want.audio).abs().max() <= 1e-5 * want.audio.abs().max()
    assert not vllm_omni.thinker.has_unfinished()


def test_image_prompt_tokens_differ_only_at_a_near_tie(vllm_omni, tiny_model_dir):
    """vLLM's vision encoder is not bitwise transformers': with random tiny weights the greedy
    tokens of an image prompt may part where the reference's top two logits nearly tie."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omni_ray.inputs.processor import InputProcessor

    msgs = _media_messages("image")
    proc = InputProcessor(tiny_model_dir)
    ids, mm = proc.build(msgs)
    _, raw = proc.build(msgs, raw_media=True)
    runner = vllm_omni.thinker
    runner.add_request("img", ids, GREEDY, 10, mm=raw)
    got = []
    while runner.has_unfinished():
        for out in runner.step():
            assert out.error is None
            got += out.new_token_ids
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_model_dir, local_files_only=True, dtype=torch.float32).thinker.eval()
    for k in range(len(got)):  # teacher-forced on vLLM's tokens
        x = torch.tensor([ids + got[:k]])
        rope, _ = thinker.get_rope_index(x, mm.image_grid_thw, None, torch.ones_like(x), False,
                                         None)
        pos = torch.cat([torch.arange(x.shape[1]).view(1, 1, -1), rope])
        with torch.inference_mode():
            logits = thinker(input_ids=x, position_ids=pos, **mm.model_kwargs("cpu")).logits[0, -1]
        top = logits.topk(2)
        if int(top.indices[0]) != got[k]:
            assert got[k] == int(top.indices[1]), (k, got[k], top)
            assert float(top.values[0] - top.values[1]) < 0.05 * float(logits.std()), (k, top)


def test_media_request_errors_stay_with_the_request(vllm_runner, tiny_model_dir):
    from omni_ray.inputs.processor import InputProcessor

    ids, features_only = InputProcessor(tiny_model_dir).build(_media_messages("audio"))
    with pytest.raises(ValueError, match="needs the decoded media"):
        vllm_runner.add_request("no-raw", ids, GREEDY, 4, mm=features_only)
    assert not vllm_runner.has_unfinished()


def test_engine_in_another_process_refuses_media_naming_why(tiny_model_dir):
    """The capture needs the engine core in this process: media prompts to an engine in another
    process get a clear error (a 400 at the ingress) instead of a talker without its hidden
    states. Built without starting a second engine: the check is on the runner's own state.
    (Compiled engines capture: tests/vllm/test_vllm_compiled.py.)"""
    from omni_ray.runners.vllm.thinker import VllmThinkerRunner

    runner = VllmThinkerRunner.__new__(VllmThinkerRunner)
    runner.media, runner._capture, runner._mm = True, None, {}
    runner._no_capture = "the vLLM engine core runs in another process"
    runner._mm_ids = {151675, 151655, 151656}
    with pytest.raises(ValueError, match="another process"):
        runner._media_prompt("r", [1, 151675, 151675, 2], None)


def test_kernel_warmup_runs_prefill_sizes_and_changes_no_answer(vllm_runner, hf_runner, prompts):
    """``runners/vllm/kernel_warmup.py`` (run at start on a GPU): dummy forwards at every
    prefill size bucket through the engine's workers; the engine's answers stay the same."""
    from omni_ray.runners.vllm.kernel_warmup import prefill_sizes, warm_kernels

    assert prefill_sizes(100) == [16, 17, 24, 25, 32, 33, 48, 49, 64, 65, 96, 97, 100]
    reqs = {f"p{i}": (p, 6, None) for i, p in enumerate(prompts)}
    engine = vllm_runner.engine
    max_tokens = engine.vllm_config.scheduler_config.max_num_batched_tokens
    seconds = warm_kernels(engine, "thinker")
    assert seconds is not None and seconds > 0, "the warm-up failed (see the log)"
    assert max(prefill_sizes(max_tokens)) == max_tokens
    assert run(vllm_runner, reqs) == run(hf_runner, reqs)
