"""Helpers shared by the vLLM test modules (one engine per module, shared by its tests)."""

from __future__ import annotations


def idle_runner(runner):
    """A fixture body: hand out a module's shared runner idle, and clear what a test left."""
    assert not runner.has_unfinished(), "a previous test left requests in the shared engine"
    yield runner
    for rid in runner.request_ids():
        runner.abort(rid)


def _marks():
    import importlib.util

    import pytest

    return [pytest.mark.slow, pytest.mark.vllm,
            pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                               reason="vllm is not installed")]


VLLM_TESTS = _marks()  # every vLLM test module's pytestmark
# A small engine for the tiny model: a short warm-up (max_num_batched_tokens; longer prompts are
# prefilled in chunks over steps) and a small KV cache.
SMALL_ENGINE = {"max_model_len": 2048, "max_num_batched_tokens": 256, "max_num_seqs": 8,
                "kv_cache_memory_bytes": 64 << 20}
