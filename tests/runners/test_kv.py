"""KV extraction and loading (omni_ray/runners/kv.py + ThinkerRunner.prefill_only/add_prefilled).

The promise: running the prompt on one runner, extracting its KV, moving it through the wire codec
and loading it into a fresh cache on another runner decodes exactly the tokens one runner would.
"""

from __future__ import annotations

import pytest
import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason, KVChunk, decode_chunk, encode_chunk
from omni_ray.runners.kv import cache_from_kv, extract_prompt_kv, kv_bytes_per_token

PROMPTS = [[151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198],
           list(range(1000, 1037))]
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05, seed=7)


@pytest.fixture(scope="module")
def thinker(tiny_model_dir):
    from omni_ray.models.loading import load_stage

    return load_stage(tiny_model_dir, "thinker")


def runner(thinker, **kw):
    from omni_ray.runners.transformers.thinker import ThinkerRunner

    return ThinkerRunner(thinker.module, eos_token_ids=[thinker.config.im_end_token_id], **kw)


def run(r) -> dict[str, tuple[list[int], FinishReason]]:
    out: dict[str, tuple[list[int], FinishReason]] = {}
    while r.has_unfinished():
        for o in r.step():
            assert o.error is None, o.error
            toks, _ = out.get(o.request_id, ([], None))
            out[o.request_id] = (toks + o.new_token_ids, o.finish_reason)
    return out


def unsplit(thinker, prompt, params, max_tokens=12):
    r = runner(thinker)
    r.add_request("a", prompt, params, max_tokens)
    return run(r)["a"]


def split(thinker, prompt, params, max_tokens=12, through_codec=True):
    """Prefill on one runner, move the KV as a KVChunk, decode on another."""
    pre = runner(thinker).prefill_only(prompt, params)
    kv = extract_prompt_kv(pre.cache, pre.num_tokens)
    del pre.cache  # the sender frees its cache once its save is done
    chunk = KVChunk(request_id="a", kv=kv, num_tokens=len(prompt), first_token=pre.first_token,
                    rng_state=pre.rng_state, rope_delta=pre.rope_delta)
    if through_codec:
        chunk = decode_chunk(bytes(encode_chunk(chunk)), KVChunk)  # read-only: a copying decode
    text_cfg = thinker.module.config.get_text_config()
    dec = runner(thinker)
    dec.add_prefilled("a", prompt, chunk.first_token, cache_from_kv(chunk.kv, text_cfg), params,
                      max_tokens, rng_state=chunk.rng_state, rope_delta=chunk.rope_delta)
    return run(dec)["a"]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["chat", "long"])
def test_split_decoding_equals_unsplit(thinker, prompt, params):
    want = unsplit(thinker, prompt, params)
    assert len(want[0]) >= 2
    assert split(thinker, prompt, params) == want


def test_extracted_kv_is_the_cache_bit_for_bit_and_survives_the_codec(thinker):
    prompt = PROMPTS[1]
    pre = runner(thinker).prefill_only(prompt, GREEDY)
    kv = extract_prompt_kv(pre.cache, len(prompt))
    cfg = thinker.module.config.get_text_config()
    assert tuple(kv.shape) == (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, len(prompt),
                               cfg.head_dim)
    for i, layer in enumerate(pre.cache.layers):
        assert torch.equal(kv[i, 0], layer.keys[0]) and torch.equal(kv[i, 1], layer.values[0])
    assert kv.numel() * kv.element_size() == kv_bytes_per_token(cfg, kv.dtype) * len(prompt)
    chunk = KVChunk(request_id="r", kv=kv, num_tokens=len(prompt), first_token=pre.first_token)
    back = decode_chunk(encode_chunk(chunk), KVChunk)
    assert torch.equal(back.kv, kv) and back.first_token == pre.first_token
    rebuilt = cache_from_kv(back.kv, cfg)
    assert rebuilt.get_seq_length() == len(prompt)
    assert torch.equal(rebuilt.layers[1].values, pre.cache.layers[1].values)
    back.kv.fill_(0)  # the rebuilt cache owns its memory
    assert torch.equal(rebuilt.layers[1].values, pre.cache.layers[1].values)


def test_any_dtype_round_trips(thinker):
    kv = torch.randn(2, 2, 1, 5, 64).to(torch.bfloat16)
    chunk = KVChunk(request_id="r", kv=kv, num_tokens=5, first_token=3)
    back = decode_chunk(encode_chunk(chunk), KVChunk)
    assert back.kv.dtype == torch.bfloat16 and torch.equal(back.kv, kv)
    cache = cache_from_kv(back.kv, thinker.module.config.get_text_config())
    assert cache.layers[0].keys.dtype == torch.bfloat16


def test_first_token_that_ends_the_request(thinker):
    prompt = PROMPTS[0]
    want = unsplit(thinker, prompt, GREEDY, max_tokens=1)
    assert want[1] is FinishReason.LENGTH and len(want[0]) == 1
    assert split(thinker, prompt, GREEDY, max_tokens=1) == want
    # a first token that is a stop id ends it with STOP on the first step, no model call
    pre = runner(thinker).prefill_only(prompt, GREEDY)
    dec = runner(thinker)
    dec.add_prefilled("s", prompt, pre.first_token, pre.cache, GREEDY, 8,
                      stop_token_ids=[pre.first_token])
    assert run(dec)["s"] == ([pre.first_token], FinishReason.STOP)


def test_prefilled_request_batched_with_ordinary_ones(thinker):
    ref = {i: unsplit(thinker, p, GREEDY) for i, p in enumerate(PROMPTS)}
    pre = runner(thinker).prefill_only(PROMPTS[0], GREEDY)
    r = runner(thinker)
    r.add_request("1", PROMPTS[1], GREEDY, 12)
    r.add_prefilled("0", PROMPTS[0], pre.first_token, pre.cache, GREEDY, 12)
    out = run(r)
    assert out["0"] == ref[0] and out["1"] == ref[1]


def test_add_prefilled_refuses_a_mismatched_cache_and_keeps_nothing(thinker):
    pre = runner(thinker).prefill_only(PROMPTS[0], GREEDY)
    r = runner(thinker)
    with pytest.raises(ValueError, match="cache holds"):
        r.add_prefilled("x", PROMPTS[0] + [5], pre.first_token, pre.cache, GREEDY, 4)
    assert r.num_requests == 0
    with pytest.raises(ValueError, match="need"):
        extract_prompt_kv(pre.cache, len(PROMPTS[0]) + 1)
    with pytest.raises(ValueError, match="layers"):
        cache_from_kv(torch.zeros(3, 2, 1, 4, 64), thinker.module.config.get_text_config())
