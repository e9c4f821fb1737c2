"""``RequestBuilder`` on the tiny checkpoint's real tokenizer and processor, in process: a body
becomes the request the stages run, or a 4xx naming its field (the HTTP tests check the same
through Serve; here each rule is seen without starting anything)."""

from __future__ import annotations

import asyncio

import pytest

from omni_ray.config.serving import OmniServingArgs
from omni_ray.ingress.api_models import ChatCompletionRequest
from omni_ray.ingress.audio_store import TranscriptStore
from omni_ray.ingress.chat_request import RequestBuilder, validate
from omni_ray.ingress.errors import APIError
from omni_ray.ingress.speech import SpeechRequest


@pytest.fixture(scope="module")
def builder(tiny_model_dir):
    from omni_ray.inputs.processor import InputProcessor
    from omni_ray.models.speakers import checkpoint_speakers
    from omni_ray.models.tokenizer import load_tokenizer

    args = OmniServingArgs(model=tiny_model_dir,
                           limits={"max_tokens": 256, "default_max_tokens": 32},
                           talker={"default_sampling": {"temperature": 0.9, "top_k": 50}})
    tok = load_tokenizer(tiny_model_dir)
    return RequestBuilder(args, tok, InputProcessor(tiny_model_dir, tok),
                          checkpoint_speakers(tiny_model_dir), TranscriptStore())


def chat(builder, **body):
    body = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "hello there"}],
            **body}
    return asyncio.run(builder.chat(ChatCompletionRequest.model_validate(body)))


def refusal(builder, **body) -> APIError:
    with pytest.raises(APIError) as e:
        chat(builder, **body)
    return e.value


def test_a_chat_body_becomes_its_request(builder):
    req, fmt = chat(builder, modalities=["text", "audio"], temperature=0.2, seed=7)
    prompt = builder.tokenizer.decode(req.prompt_token_ids)
    assert "hello there" in prompt and prompt.rstrip().endswith("assistant")
    assert req.modalities == ("text", "audio") and req.wants_audio and fmt == "wav"
    assert req.max_tokens == 32  # limits.default_max_tokens
    assert req.thinker_sampling.temperature == 0.2 and req.thinker_sampling.seed == 7
    assert req.talker_sampling.seed == 7  # a sampling talker takes the seed too
    assert req.talker_sampling.temperature == 0.9  # its default, not the thinker's override
    assert req.speaker == builder.args.default_speaker and req.mm is None
    assert chat(builder, stream=True)[1] == "pcm16"  # a streamed answer's default


@pytest.mark.parametrize("body, status, param", [
    (dict(model="other"), 404, "model"),
    (dict(max_tokens=257), 400, "max_tokens"),
    (dict(modalities=["text", "text"]), 400, "modalities"),
    (dict(modalities=["text", "audio"], audio={"voice": "nobody", "format": "wav"}), 400,
     "audio.voice"),
    (dict(messages=[{"role": "system", "content": "be brief"}]), 400, "messages"),
    (dict(messages=[{"role": "user", "content": ""}]), 400, "messages.0.content"),
    (dict(stream=True, modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}),
     400, "audio.format"),
])
def test_a_bad_body_is_refused_naming_its_field(builder, body, status, param):
    e = refusal(builder, **body)
    assert (e.status, e.param) == (status, param), e.body()


def test_an_earlier_spoken_answer_is_named_by_its_id(builder):
    builder.transcripts.put("audio_abc", "the earlier answer")
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "audio": {"id": "audio_abc"}},
             {"role": "user", "content": "and then?"}]
    req, _ = chat(builder, messages=turns)
    assert "the earlier answer" in builder.tokenizer.decode(req.prompt_token_ids)
    turns[1]["audio"]["id"] = "audio_gone"
    e = refusal(builder, messages=turns)
    assert (e.param, e.code) == ("messages.1.audio.id", "invalid_audio_id")


def test_a_speech_body_gives_the_answer_to_voice(builder):
    body = validate(SpeechRequest, {"model": "qwen3-omni", "input": "say this", "voice": "ethan"})
    req = asyncio.run(builder.speech(body))
    assert builder.tokenizer.decode(req.answer_token_ids).startswith("say this")
    assert req.max_tokens == len(req.answer_token_ids) and req.wants_audio
    with pytest.raises(APIError) as e:
        validate(SpeechRequest, {"model": "qwen3-omni", "input": "", "voice": "ethan"})
    assert (e.value.status, e.value.param) == (400, "input")
