"""The vLLM end of the prefill/decode KV hand-off (omni_ray/runners/vllm/kv_connector.py).

One vLLM engine with omni_ray's KV connector plays both sides (a second engine in one process
would share vLLM's process-wide connector); the transformers runner is the reference and the
other backend. The KV travels in the portable layout, so vLLM <-> transformers hand-offs work too.
"""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import SMALL_ENGINE, VLLM_TESTS

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason
from omni_ray.runners.factory import make_runner, stage_config

pytestmark = VLLM_TESTS
GREEDY = SamplingParams()
# No prefix caching: every hand-off must load its KV (a local cache hit would hide a bad load).
# max_num_batched_tokens 256: the 500-token prompt is prefilled in chunks over steps.
ENGINE_KWARGS = {**SMALL_ENGINE, "enable_prefix_caching": False}
TEXTS = ["Hi", "Tell me a story about cats and dogs " * 3,
         "Count: " + " ".join(str(i) for i in range(150))]


@pytest.fixture(scope="module")
def vllm_kv(tiny_model_dir):
    cfg = stage_config("thinker", "vllm", dtype=torch.float32, max_num_seqs=8,
                       engine_kwargs=ENGINE_KWARGS)
    runner = make_runner("thinker", tiny_model_dir, cfg, pipeline=PipelineConfig(),
                         kv_transfer=True)
    yield runner
    runner.shutdown()


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return make_runner("thinker", tiny_model_dir, stage_config("thinker", dtype=torch.float32),
                       pipeline=PipelineConfig())


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    from omni_ray.models.tokenizer import encode_chat, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    return [encode_chat(tok, [{"role": "user", "content": t}]) for t in TEXTS]


def run(runner, rid, ids, max_tokens, kv=None, first=None, stop=None):
    if kv is None:
        runner.add_request(rid, ids, GREEDY, max_tokens, stop)
    else:
        runner.add_prefilled_kv(rid, ids, first, kv, GREEDY, max_tokens, stop)
    tokens, reason = [], None
    while runner.has_unfinished():
        for out in runner.step():
            assert out.error is None, out.error
            tokens += out.new_token_ids
            reason = out.finish_reason if out.finished else reason
    return tokens, reason


def assert_clean(runner):
    from omni_ray.runners.vllm import kv_connector as conn

    assert not runner.has_unfinished() and conn.SAVED == {} and conn.TO_LOAD == {}


@pytest.mark.parametrize("i", range(len(TEXTS)))
def test_every_pair_of_backends_gives_the_unsplit_answer(vllm_kv, hf, prompts, i):
    ids = prompts[i]
    want, _ = run(hf, f"ref{i}", ids, 12)
    v_pre, h_pre = vllm_kv.prefill_only(ids, GREEDY), hf.prefill_only(ids, GREEDY)
    v_kv, h_kv = vllm_kv.extract_kv(v_pre), hf.extract_kv(h_pre)
    # vLLM's paged KV read out in the portable layout is transformers' cache
    assert v_kv.shape == h_kv.shape == (2, 2, 1, len(ids), 64)
    assert (v_kv - h_kv).abs().max() < 1e-5 and v_pre.first_token == h_pre.first_token == want[0]
    assert run(vllm_kv, f"vv{i}", ids, 12, v_kv, v_pre.first_token)[0] == want
    assert run(vllm_kv, f"hv{i}", ids, 12, h_kv, h_pre.first_token)[0] == want
    assert run(hf, f"vh{i}", ids, 12, v_kv, v_pre.first_token)[0] == want
    assert_clean(vllm_kv)


def test_the_loaded_kv_is_what_decodes(vllm_kv, prompts):
    """Control: a zeroed KV gives another answer, so the decode did read the loaded blocks."""
    ids = prompts[1]
    pre = vllm_kv.prefill_only(ids, GREEDY)
    good, _ = run(vllm_kv, "good", ids, 8, pre.cache, pre.first_token)
    bad, _ = run(vllm_kv, "bad", ids, 8, torch.zeros_like(pre.cache), pre.first_token)
    assert good[0] == bad[0] and good != bad
    assert_clean(vllm_kv)


def test_first_token_that_ends_the_request(vllm_kv, prompts):
    ids = prompts[0]
    pre = vllm_kv.prefill_only(ids, GREEDY)
    assert run(vllm_kv, "one", ids, 1, pre.cache, pre.first_token) == (
        [pre.first_token], FinishReason.LENGTH)
    assert run(vllm_kv, "stop", ids, 8, pre.cache, pre.first_token, [pre.first_token]) == (
        [pre.first_token], FinishReason.STOP)
    assert_clean(vllm_kv)


def test_abort_and_bad_kv_leave_nothing_behind(vllm_kv, prompts):
    ids = prompts[2]
    pre = vllm_kv.prefill_only(ids, GREEDY)
    vllm_kv.add_prefilled_kv("gone", ids, pre.first_token, pre.cache, GREEDY, 20)
    vllm_kv.step()
    assert vllm_kv.abort("gone")
    with pytest.raises(ValueError, match="KV holds"):
        vllm_kv.add_prefilled_kv("short", ids[:-1] + ids, pre.first_token, pre.cache, GREEDY, 4)
    assert_clean(vllm_kv)
