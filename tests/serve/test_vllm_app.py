"""The Serve app with the thinker on vLLM (CPU, float32): text and spoken input over HTTP give the
transformers backend's answers (the deployment path of tests/vllm)."""

from __future__ import annotations

import importlib.util

import httpx
import numpy as np
import pytest
from serve_helpers import app_args, wait_clean
from chat_helpers import ask as ask_text
from chat_helpers import offline_answer as offline_text_answer
from media_helpers import CASES, ask, offline_answer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]
APP, PREFIX = "omni-vllm", "/vllm"
ENGINE_KWARGS = {"max_model_len": 2048, "max_num_batched_tokens": 512, "max_num_seqs": 8,
                 "kv_cache_memory_bytes": 128 << 20}


@pytest.fixture(scope="module")
def vllm_url(serve_base_url, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    args = app_args(tiny_model_dir, "async_chunk",
                    thinker={"backend": "vllm", "engine_kwargs": ENGINE_KWARGS})
    serve.run(build_omni_app(args), name=APP, route_prefix=PREFIX)
    yield f"{serve_base_url}{PREFIX}"
    serve.delete(APP)


@pytest.mark.parametrize("case", ["wav", "mp3+png"])
@pytest.mark.parametrize("app", ["vllm_url", "all_vllm_url"], ids=["vllm-thinker", "all-vllm"])
def test_spoken_input_answers_equal_the_transformers_pipeline(request, offline, app, case):
    """Speech (and a picture) in, speech out, with the thinker on vLLM and with both stages on
    vLLM (the talker's 3-D positions reach vLLM): the transformers pipeline's text and audio."""
    url = request.getfixturevalue(app)
    parts, media = CASES[case]
    ref_text, ref_pcm = offline_answer(offline["async_chunk"], media)
    text, pcm = ask(url, parts, stream=True)
    assert text == ref_text
    assert pcm.shape == ref_pcm.shape
    assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1
    assert wait_clean(url, 10) == {}


def test_text_answer_equals_the_transformers_app(vllm_url, serve_urls):
    body = {"model": "qwen3-omni", "max_tokens": 12, "modalities": ["text"],
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    got = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120).json()
    want = httpx.post(f"{serve_urls['async_chunk']}/v1/chat/completions", json=body,
                      timeout=120).json()
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert got["usage"] == want["usage"]


# -- thinker and talker both on vLLM -------------------------------------------------------------
@pytest.fixture(scope="module")
def all_vllm_url(serve_base_url, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    args = app_args(tiny_model_dir, "async_chunk",
                    thinker={"backend": "vllm", "engine_kwargs": ENGINE_KWARGS},
                    talker={"backend": "vllm", "engine_kwargs": ENGINE_KWARGS})
    serve.run(build_omni_app(args), name="omni-all-vllm", route_prefix="/allvllm")
    yield f"{serve_base_url}/allvllm"
    serve.delete("omni-all-vllm")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "wav"])
def test_all_vllm_app_speaks_like_the_transformers_pipeline(all_vllm_url, offline, stream):
    """openai client -> Serve app with thinker and talker on vLLM: the same text and the same
    audio (PCM16 within 1 LSB) as the transformers pipeline, streamed and not."""
    ref_text, ref_pcm = offline_text_answer(offline["async_chunk"])
    text, pcm, finish, _ = ask_text(all_vllm_url, stream=stream)
    assert text == ref_text
    assert pcm is not None and pcm.shape == ref_pcm.shape
    assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1
    assert finish in ("stop", "length")
    assert wait_clean(all_vllm_url, 10) == {}
