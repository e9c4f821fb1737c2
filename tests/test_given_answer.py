"""Text to speech through the pipeline: a request whose answer is given
(``OmniRequest.answer_token_ids``) is voiced without a thinker step, and its audio equals the
chat path's when the thinker happened to generate the same ids (real transformers runners on the
tiny checkpoint; both delivery modes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def omnis(omni_by_mode):
    return omni_by_mode


@pytest.mark.parametrize("mode", ["async_chunk", "sync"])
def test_given_answer_is_voiced_like_the_generated_one(omnis, mode):
    omni = omnis[mode]
    chat = omni.generate(omni.request(MESSAGES, "chat", max_tokens=12, max_audio_frames=40))[0]
    assert chat.error is None and len(chat.text_token_ids) == 12
    given = omni.generate(omni.request(MESSAGES, "tts", answer_token_ids=chat.text_token_ids,
                                       max_audio_frames=40))[0]
    assert given.error is None
    assert given.text_token_ids == chat.text_token_ids  # spoken exactly as given
    assert given.audio.numel() > 0 and torch.equal(given.audio, chat.audio)


def test_given_answer_beside_generated_ones_and_alone_agree(omnis):
    omni = omnis["async_chunk"]
    ids = omni.prompt_ids("Hello there.")[-6:]
    alone = omni.generate(omni.request(MESSAGES, "a", answer_token_ids=ids,
                                       max_audio_frames=30))[0]
    batch = omni.generate([omni.request(MESSAGES, "b", answer_token_ids=ids, max_audio_frames=30),
                           omni.request(MESSAGES, "c", max_tokens=8, max_audio_frames=30)])
    assert batch[0].text_token_ids == ids == alone.text_token_ids
    assert torch.equal(batch[0].audio, alone.audio) and batch[1].error is None


def test_given_answer_with_media_is_refused(omnis):
    omni = omnis["sync"]
    audio = np.zeros(16000, np.float32)
    with pytest.raises(ValueError, match="answer_token_ids"):
        omni.request([{"role": "user", "content": [{"type": "audio", "audio": audio},
                                                   {"type": "text", "text": "Hi"}]}],
                     "m", answer_token_ids=[1, 2])
