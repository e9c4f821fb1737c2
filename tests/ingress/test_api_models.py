"""The request model against OpenAI's own list of chat fields (the ``openai`` package): every
field a client may send is declared, so each is honoured, harmless or refused by name, never
silently dropped. No Ray: the model alone (the HTTP answers are in tests/serve/test_hostile.py)."""

from __future__ import annotations

import typing

import pytest
from openai.types.chat import completion_create_params as params
from pydantic import ValidationError

from omni_ray.ingress.api_models import ChatCompletionRequest, ChatMessage

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def openai_fields() -> set[str]:
    fields: set[str] = set()
    for cls in (params.CompletionCreateParamsNonStreaming, params.CompletionCreateParamsStreaming):
        fields |= set(typing.get_type_hints(cls))
    return fields


def test_every_openai_chat_field_is_declared():
    missing = openai_fields() - set(ChatCompletionRequest.model_fields)
    assert not missing, f"decide for each: honour, accept as harmless, or Unsupported(...): {missing}"


def test_openai_message_fields_are_declared():
    from openai.types.chat import ChatCompletionAssistantMessageParam, ChatCompletionUserMessageParam

    want = set(typing.get_type_hints(ChatCompletionAssistantMessageParam)) | set(
        typing.get_type_hints(ChatCompletionUserMessageParam))
    assert want - set(ChatMessage.model_fields) == set()


@pytest.mark.parametrize("field", sorted(
    name for name, f in ChatCompletionRequest.model_fields.items()
    if any(getattr(m, "json_schema", None) and "not supported" in str(m.json_schema)
           for m in f.metadata)))
def test_each_unsupported_field_refuses_a_real_value(field):
    """Some value of each unsupported field is refused as unsupported_parameter (a canary for
    a no-op list that would accept everything)."""
    for value in ([{"x": 1}], {"x": 1}, "x", True, 3, 0.5, ["x"]):
        try:
            ChatCompletionRequest.model_validate({**BASE, field: value})
        except ValidationError as e:
            if e.errors()[0]["type"] == "unsupported_parameter":
                return
    pytest.fail(f"{field}: no value was refused as unsupported")


def test_warm_up_bodies_pass_the_audio_format_check():
    """The warm-up's streamed bodies name no audio format: pcm16, not a 400 (which would make
    the warm-up skip them)."""
    from omni_ray.config.serving import LimitsConfig
    from omni_ray.ingress.chat_request import answer_audio_format
    from omni_ray.ingress.warmup import warmup_bodies

    for body in warmup_bodies("m", LimitsConfig(), with_audio_input=False):
        assert body.stream and answer_audio_format(body) == "pcm16"


@pytest.mark.parametrize("stream, audio, want", [
    (False, None, "wav"), (False, {"voice": "x", "format": "aac"}, "aac"),
    (True, {"voice": "x"}, "pcm16"), (True, {"voice": "x", "format": "pcm16"}, "pcm16"),
    (True, {"voice": "x", "format": "mp3"}, "audio.format"),
    (True, {"voice": "x", "format": "wav"}, "audio.format"),
])
def test_streamed_answers_are_pcm16(stream, audio, want):
    from omni_ray.ingress.chat_request import answer_audio_format
    from omni_ray.ingress.errors import APIError

    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream,
         "modalities": ["text", "audio"], **({"audio": audio} if audio else {})})
    if want == "audio.format":
        with pytest.raises(APIError) as e:
            answer_audio_format(body)
        assert e.value.param == "audio.format" and e.value.status == 400
    else:
        assert answer_audio_format(body) == want


def test_ignore_eos_takes_a_bool_only():
    """The ``ignore_eos`` extension: a JSON bool; ``"yes"`` or ``1`` is refused naming it
    (the 400's ``param``), not read as true."""
    assert ChatCompletionRequest.model_validate({**BASE, "ignore_eos": True}).ignore_eos is True
    assert ChatCompletionRequest.model_validate(BASE).ignore_eos is None
    for bad in ("yes", 1):
        with pytest.raises(ValidationError) as e:
            ChatCompletionRequest.model_validate({**BASE, "ignore_eos": bad})
        assert e.value.errors()[0]["loc"] == ("ignore_eos",)
