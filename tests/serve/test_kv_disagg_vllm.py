"""Thinker prefill/decode disaggregation with both sides on vLLM (CPU): the KV moves through
omni_ray's vLLM KV connector and the ingress-owned lifecycle, and the answers equal the
non-disaggregated app's (tests/serve/test_kv_disagg.py runs the same on transformers)."""

from __future__ import annotations

import importlib.util

import pytest
import httpx
from kv_helpers import (
    APP,
    FAILURES,
    STATES,
    TIMEOUTS,
    ask,
    body,
    kv_args,
    kv_counts,
    reference_answers,
    same_answer,
    stats,
    wait_clean,
)
from serve_helpers import wait_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]
# No prefix caching: every hand-off must load its KV.
VLLM = {"backend": "vllm", "engine_kwargs": {
    "max_model_len": 2048, "max_num_batched_tokens": 256, "max_num_seqs": 8,
    "kv_cache_memory_bytes": 64 << 20, "enable_prefix_caching": False}}


@pytest.fixture(scope="module")
def reference(serve_port, tiny_model_dir):
    return reference_answers(serve_port, tiny_model_dir)


@pytest.fixture(scope="module")
def vllm_kv_url(serve_port, reference, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    # Bounds that only a real failure reaches, not a stall of this shared 2-core machine under
    # others' load (transfer_s 3 s made the happy path fall back; see the hand-off test).
    disagg = {"timeouts": {**TIMEOUTS, "prefill_s": 60.0, "transfer_s": 10.0},
              "fallback": "local_prefill",
              "prefill": VLLM, "decode": VLLM}
    serve.run(build_omni_app(kv_args(tiny_model_dir, thinker_disaggregation=disagg)),
              name=f"{APP}-vllm", route_prefix="/kv-vllm")
    yield wait_ready(f"http://127.0.0.1:{serve_port}/kv-vllm")
    serve.delete(f"{APP}-vllm")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("modalities", [("text", "audio"), ("text",)])
def test_vllm_to_vllm_hand_off_gives_the_same_answer(vllm_kv_url, reference, modalities,
                                                     stream):
    before = kv_counts(vllm_kv_url)
    same_answer(ask(vllm_kv_url, modalities, stream), reference[(modalities, stream)])
    after = kv_counts(vllm_kv_url)
    last = stats(vllm_kv_url)["kv_ingress"]["recent"][-1]  # this request's hand-off
    print(f"\nhand-off: " + ", ".join(f"{k} {last[k] * 1e3:.0f} ms" for k in (
        "prefill_s", "save_s", "decode_open_s", "fetch_s", "load_s") if last[k] is not None))
    # No lag: the ingress counts a hand-off (released, or failed + fallback) before the request's
    # first token. A right answer with kv_released unchanged (issue 18 item 12) is a hand-off
    # that failed and fell back to a local prefill; the bound most likely hit was the KV fetch's
    # transfer_s, 3 s here then (the smallest on the path; the steps take 10-120 ms at load 10-20,
    # and this machine sees load averages of 30-190). The vLLM app now has 10 s.
    assert after["kv_fallbacks"] == before["kv_fallbacks"], (
        f"the hand-off fell back to a local prefill: {last}; {before} -> {after}")
    assert after["kv_released"] == before["kv_released"] + 1, (before, after, last)
    assert wait_clean(vllm_kv_url) == {}


@pytest.mark.parametrize("fault", [f for f in FAILURES if f != "prefill_dies"])
def test_failure_falls_back_to_a_local_prefill(vllm_kv_url, reference, fault):
    """(``prefill_dies`` is left to the transformers test: restarting a vLLM engine is slow.)"""
    before = kv_counts(vllm_kv_url)
    same_answer(ask(vllm_kv_url, ("text",), False, fault=fault), reference[(("text",), False)])
    assert kv_counts(vllm_kv_url)["kv_fallbacks"] == before["kv_fallbacks"] + 1
    assert wait_clean(vllm_kv_url) == {}


@pytest.mark.parametrize("state", STATES)
def test_abort_at_each_state_releases_everything(vllm_kv_url, state):
    r = httpx.post(f"{vllm_kv_url}/v1/chat/completions", json=body(("text",)),
                   headers={"x-omni-kv-fault": f"abort_at:{state}"}, timeout=120)
    assert r.status_code == 500 and f"aborted at {state}" in r.json()["error"]["message"]
    assert wait_clean(vllm_kv_url) == {}
    s = stats(vllm_kv_url)
    assert s["thinker_prefill"]["kv_saves"] >= 1 and s["thinker"]["stage"] == "thinker_decode"
