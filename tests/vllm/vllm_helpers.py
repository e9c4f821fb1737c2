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


# -- whole-pipeline comparisons (the transformers pipeline is the oracle) -------------------------
# (text, max_tokens, max_audio_frames): a one-token answer (only tts_eos to speak), answers
# ending by length and by end of turn, one long enough to fill many frames.
SPECS = [("Hi", 1, 12), ("Hi", 20, 60), ("Tell me a story about a cat.", 30, 90),
         ("What is 2+2? " * 8, 6, 40)]


def text_requests(omni):
    return [omni.request([{"role": "user", "content": t}], request_id=f"r{i}", max_tokens=n,
                         max_audio_frames=f) for i, (t, n, f) in enumerate(SPECS)]


def pipeline_run(omni, mode, requests=text_requests):
    omni.pipeline = omni.pipeline.model_copy(update={"mode": mode})
    return omni.generate(requests(omni))


def media_requests(omni):
    """An audio, an image and an audio+image prompt (the talker gets the thinker's hidden states
    at their positions and computes 3-D positions from their layout)."""
    from media_samples import audio_bytes, picture, tone

    from omni_ray.inputs.audio import decode_audio

    audio = decode_audio(audio_bytes(tone(1.5)), "wav", max_seconds=10)
    kinds = {"audio": [{"type": "audio", "audio": audio}],
             "image": [{"type": "image", "image": picture(96, 64)}]}
    kinds["both"] = kinds["audio"] + kinds["image"]
    return [omni.request([{"role": "user", "content": parts + [
        {"type": "text", "text": "What do you hear and see?"}]}], request_id=f"m-{k}",
        max_tokens=10, max_audio_frames=40) for k, parts in kinds.items()]


def assert_same_answers(ref_outs, outs):
    """Same text tokens, finish reasons and codec frames; waveforms within 1e-5 of the peak."""
    import torch

    assert len(outs) == len(ref_outs)
    for a, b in zip(ref_outs, outs):
        assert b.error is None, (a.request_id, b.error)
        assert b.text_token_ids == a.text_token_ids, a.request_id
        assert b.finish_reason == a.finish_reason, a.request_id
        assert b.codec_frames.shape == a.codec_frames.shape, a.request_id
        assert torch.equal(b.codec_frames, a.codec_frames), a.request_id
        peak = float(a.audio.abs().max()) or 1.0
        assert float((a.audio - b.audio).abs().max()) <= 1e-5 * peak, a.request_id
