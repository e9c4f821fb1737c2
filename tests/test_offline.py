"""Omni (offline pipeline) bookkeeping: a rejected request leaves no state behind."""

from __future__ import annotations

import pytest
import torch

from omni_ray.config.request import OmniRequest
from omni_ray.offline import Omni


@pytest.fixture(scope="module")
def omni(omni_by_mode) -> Omni:
    return omni_by_mode["async_chunk"]


def _runner_ids(omni: Omni) -> tuple[list[str], ...]:
    return omni.thinker.request_ids(), omni.talker.request_ids(), omni.code2wav.request_ids()


def test_rejected_request_leaves_pipeline_usable(omni):
    ids = omni.prompt_ids("Hi")
    good = OmniRequest(request_id="good", prompt_token_ids=ids, max_tokens=3, max_audio_frames=6)
    bad = OmniRequest(request_id="bad", prompt_token_ids=ids, max_tokens=3, speaker="nobody")
    before = omni.generate(good)[0]
    with pytest.raises(ValueError, match="unknown speaker"):
        omni.generate([good, bad])  # "bad" fails in the talker after the thinker took it
    assert _runner_ids(omni) == ([], [], [])
    after = omni.generate(good)[0]  # same id again: nothing of the failed call is left
    assert after.text_token_ids == before.text_token_ids
    assert torch.equal(after.audio, before.audio)


def test_duplicate_ids_in_one_call_are_rejected(omni):
    r = OmniRequest(request_id="dup", prompt_token_ids=omni.prompt_ids("Hi"), max_tokens=2,
                    modalities=("text",))
    with pytest.raises(ValueError, match="duplicate"):
        omni.generate([r, r])
    assert _runner_ids(omni) == ([], [], [])
    assert len(omni.generate(r)[0].text_token_ids) == 2


def test_unservable_prompt_fails_cleanly(omni):
    """A prompt without an assistant turn fails in the talker mid-run; everything is aborted."""
    r = OmniRequest(request_id="noturn", prompt_token_ids=[1, 2, 3], max_tokens=4)
    with pytest.raises(ValueError, match="assistant"):
        omni.generate(r)
    assert _runner_ids(omni) == ([], [], [])


def test_a_talker_failure_is_reported_on_the_output_not_swallowed(tiny_model_dir, monkeypatch):
    """A request whose talker fails still returns its text, and says why it has no audio."""
    from omni_ray.config.request import OmniRequest
    from omni_ray.offline import Omni

    omni = Omni(tiny_model_dir, mode="async_chunk")
    monkeypatch.setattr(omni.talker.inputs, "assistant_part",
                        lambda seq: (_ for _ in ()).throw(RuntimeError("boom")))
    out = omni.generate(OmniRequest(request_id="x", prompt_token_ids=omni.prompt_ids("Hi"),
                                    max_tokens=4, max_audio_frames=8))[0]
    assert out.text_token_ids and out.codec_frames.shape[0] == 0
    assert out.error == "talker: RuntimeError: boom"
    assert out.summary()["error"] == out.error
