"""Continuous batching: requests decoded together give what each gives alone.

Different prompt lengths, max_tokens, speakers and modalities in one ``generate([...])``; each
request owns its caches, generators and chunkers, so batch neighbours must not change anything.
"""

from __future__ import annotations

import pytest
import torch

from omni_ray.config.request import OmniRequest
from omni_ray.offline import Omni


@pytest.fixture(scope="module", params=["sync", "async_chunk"])
def omni(request, omni_by_mode) -> Omni:
    return omni_by_mode[request.param]


def _requests(omni: Omni) -> list[OmniRequest]:
    return [
        OmniRequest(request_id="short", prompt_token_ids=omni.prompt_ids("Hi"), speaker="chelsie",
                    max_tokens=4, max_audio_frames=20),
        OmniRequest(request_id="system", speaker="ethan", max_tokens=9, max_audio_frames=33,
                    prompt_token_ids=omni.prompt_ids("What is the capital of France, and why?",
                                                     system="You are a helpful assistant.")),
        OmniRequest(request_id="text-only", prompt_token_ids=omni.prompt_ids("Count to ten."),
                    max_tokens=7, modalities=("text",)),
        OmniRequest(request_id="aiden", prompt_token_ids=omni.prompt_ids("Tell me a story."),
                    speaker="aiden", max_tokens=6, max_audio_frames=27),
    ]


def test_batch_equals_alone(omni):
    reqs = _requests(omni)
    assert len({len(r.prompt_token_ids) for r in reqs}) == len(reqs)  # lengths differ
    alone = [omni.generate(r)[0] for r in reqs]
    together = omni.generate(reqs)
    assert [o.request_id for o in together] == [r.request_id for r in reqs]
    for a, t, r in zip(alone, together, reqs):
        assert t.text_token_ids == a.text_token_ids
        assert len(t.text_token_ids) == r.max_tokens
        assert t.finish_reason == a.finish_reason
        assert torch.equal(t.codec_frames, a.codec_frames)
        assert torch.equal(t.audio, a.audio)
        assert t.audio_pieces == a.audio_pieces
        if r.wants_audio:
            assert t.codec_frames.shape[0] > 0
        else:
            assert t.codec_frames.shape[0] == 0 and t.audio.numel() == 0


def test_batch_with_an_identical_twin(omni):
    """Two copies of one request in one batch (different ids) stay independent and equal."""
    r = _requests(omni)[0]
    twin = r.model_copy(update={"request_id": "twin"})
    a, b = omni.generate([r, twin])
    assert a.text_token_ids == b.text_token_ids
    assert torch.equal(a.codec_frames, b.codec_frames) and torch.equal(a.audio, b.audio)
