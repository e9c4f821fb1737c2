"""A smoke dummy checkpoint (no weight files) on the vLLM thinker and talker: both engines get
``load_format: "dummy"`` from the factory, and the offline pipeline answers with text and audio."""

from __future__ import annotations

import torch
from vllm_helpers import SMALL_ENGINE, VLLM_TESTS

from omni_ray.config.request import OmniRequest

pytestmark = VLLM_TESTS


def test_vllm_stages_on_a_smoke_dummy(tmp_path):
    from omni_ray.models.dummy import make_dummy_checkpoint
    from omni_ray.offline import Omni

    d = make_dummy_checkpoint(tmp_path / "ckpt", shape="smoke", seed=0)
    omni = Omni(d, mode="async_chunk", thinker_backend="vllm", talker_backend="vllm",
                thinker_engine_kwargs=dict(SMALL_ENGINE),
                talker_engine_kwargs=dict(SMALL_ENGINE))
    try:
        for runner in (omni.thinker, omni.talker):
            assert runner.engine.vllm_config.load_config.load_format == "dummy"
        out = omni.generate(OmniRequest(request_id="d", prompt_token_ids=omni.prompt_ids("Hi"),
                                        max_tokens=6, max_audio_frames=10))[0]
        assert out.error is None and len(out.text_token_ids) == 6
        assert out.codec_frames.shape[1] == 16 and 0 < out.codec_frames.shape[0] <= 10
        assert out.audio.numel() > 0 and torch.isfinite(out.audio).all()
    finally:
        for runner in (omni.thinker, omni.talker):
            shutdown = getattr(runner, "shutdown", None)
            if shutdown is not None:
                shutdown()
