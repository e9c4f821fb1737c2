"""The vLLM thinker and talker compiled as on a GPU (torch.compile on, no ``enforce_eager``),
on the tiny checkpoint on CPU: the GPU's code path, which CI can build here.

Oracle: the transformers pipeline, greedy, in both delivery modes, for text prompts and for
audio and audio+image prompts (the thinker's compiled forward copies the talker's accept-layer
rows: omni_ray/models/vllm_thinker.py; the talker's compiled backbone takes the prompt's 3-D
positions). An image-only prompt is left out of the exact comparison: vLLM's vision encoder is
not bitwise transformers', and with random tiny weights that prompt's greedy tokens part at a
near tie, compiled or eager alike (test_vllm_thinker.py checks that tie). Both engines compile
with inductor here (~1-2 min on 2 cores).
"""

from __future__ import annotations

import pytest
from vllm_helpers import (SMALL_ENGINE, VLLM_TESTS, assert_same_answers, media_requests,
                          pipeline_run, text_requests)

pytestmark = VLLM_TESTS
COMPILED = {**SMALL_ENGINE, "enforce_eager": False}


def exact_media_requests(omni):
    """The audio and the audio+image prompt of ``media_requests``."""
    return [r for r in media_requests(omni) if r.request_id != "m-image"]


@pytest.fixture(scope="module")
def hf_omni(tiny_model_dir):
    from omni_ray.offline import Omni

    return Omni(tiny_model_dir, mode="sync")


@pytest.fixture(scope="module")
def compiled_omni(tiny_model_dir):
    from omni_ray.offline import Omni

    omni = Omni(tiny_model_dir, mode="sync", thinker_backend="vllm", talker_backend="vllm",
                thinker_engine_kwargs=COMPILED, talker_engine_kwargs=COMPILED)
    yield omni
    omni.shutdown()


def test_engines_are_compiled(compiled_omni):
    """Not eager: vLLM compiled both models (the configuration a GPU runs)."""
    for runner in (compiled_omni.thinker, compiled_omni.talker):
        config = runner.engine.vllm_config
        assert not config.model_config.enforce_eager
        assert config.compilation_config.mode != 0  # CompilationMode.NONE


@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
@pytest.mark.parametrize("requests", [text_requests, exact_media_requests],
                         ids=["text", "media"])
def test_compiled_pipeline_equals_transformers(hf_omni, compiled_omni, mode, requests):
    assert_same_answers(pipeline_run(hf_omni, mode, requests),
                        pipeline_run(compiled_omni, mode, requests))
    assert not compiled_omni.thinker._capture._want  # every capture taken
    assert not compiled_omni.talker._bridge.positions


def test_capture_is_needed(hf_omni, compiled_omni, monkeypatch):
    """Negative control: with the captured rows zeroed, the spoken answer to a media prompt
    differs (the copy out of the compiled forward is what the talker gets)."""
    capture = compiled_omni.thinker._capture
    take = capture.take
    monkeypatch.setattr(capture, "take", lambda rid: take(rid) * 0)
    ref = pipeline_run(hf_omni, "sync", lambda o: media_requests(o)[:1])
    got = pipeline_run(compiled_omni, "sync", lambda o: media_requests(o)[:1])
    assert got[0].text_token_ids == ref[0].text_token_ids
    assert got[0].codec_frames.shape != ref[0].codec_frames.shape or \
        not (got[0].codec_frames == ref[0].codec_frames).all()
