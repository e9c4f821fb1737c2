"""The subset of OpenAI's Chat Completions API that omni_ray serves (text and audio out)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError


def _utf8(text: str) -> str:
    """JSON may carry lone surrogates (``"\\ud800"``) that no tokenizer can take: a 400 here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode text (a lone surrogate at character {e.start})") \
            from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class Strict(BaseModel):
    """Request models: no coercion (``"4"``, ``true`` and ``4.0`` are not ints, ``"yes"`` is
    not a bool) and no unknown fields (a 400 naming the field, as OpenAI's API answers)."""

    model_config = ConfigDict(strict=True, extra="forbid")


def unsupported(*no_ops: Any) -> AfterValidator:
    """A field this server does not honour: accepted only with a value that asks for nothing
    (``None``, the OpenAI default, an empty list), refused otherwise with a 400 saying so."""

    def check(v: Any) -> Any:
        if v is None or v in no_ops:  # strict types first: True never stands for 1 here
            return v
        raise PydanticCustomError("unsupported_parameter",
                                  "not supported by this server (accepted only as {accepted})",
                                  {"accepted": ", ".join(["null", *map(json.dumps, no_ops)])})

    return AfterValidator(check)


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class InputAudio(Strict):
    data: str = Field(description="base64 audio")
    format: Literal["wav", "mp3"]


class InputAudioPart(Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageURL(Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[Union[TextPart, InputAudioPart, ImageURLPart], Field(discriminator="type")]
Json = Any  # a JSON value whose shape this server does not read (refused unless a no-op)


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[ContentPart] | None = None
    name: str | None = Field(None, description="accepted and ignored")
    # Assistant turns with tool calls or audio references need features this server lacks.
    tool_calls: Annotated[list[Json] | None, unsupported([])] = None
    function_call: Annotated[Json | None, unsupported()] = None
    audio: Annotated[Json | None, unsupported()] = None
    refusal: str | None = Field(None, description="accepted and ignored")


class AudioParams(Strict):
    voice: str
    format: Literal["wav", "pcm16"] = "wav"


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = Field(None, description="accepted; nothing is obfuscated")


GREEDY_BELOW = 1e-5  # temperatures under this are sampled as 0 (greedy)


class ChatCompletionRequest(Strict):
    """Every field of OpenAI's ``CompletionCreateParams``: honoured, accepted as harmless
    (``user``, ``metadata``, ``store: false``, ...) or refused with a 400 naming it (tools,
    structured output, stop strings, penalties, logprobs, ``n > 1``, ...) unless its value asks
    for nothing. Unknown fields are refused, as by OpenAI's API."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParams | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    max_audio_frames: int | None = Field(None, ge=1, description="omni_ray extension: 80 ms frames")
    temperature: float | None = Field(None, ge=0.0, le=2.0,
                                      description=f"below {GREEDY_BELOW} means 0 (greedy)")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, description="int64")
    # Harmless: accepted, nothing to do.
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Json] | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # Not honoured: refused unless the value asks for nothing.
    n: Annotated[int | None, unsupported(1)] = None
    store: Annotated[bool | None, unsupported(False)] = None
    tools: Annotated[list[Json] | None, unsupported([])] = None
    tool_choice: Annotated[Json | None, unsupported("none")] = None
    parallel_tool_calls: Annotated[bool | None, unsupported()] = None
    functions: Annotated[list[Json] | None, unsupported([])] = None
    function_call: Annotated[Json | None, unsupported("none")] = None
    response_format: Annotated[Json | None, unsupported({"type": "text"})] = None
    stop: Annotated[str | list[str] | None, unsupported([])] = None
    logprobs: Annotated[bool | None, unsupported(False)] = None
    top_logprobs: Annotated[int | None, unsupported(0)] = None
    logit_bias: Annotated[dict[str, Json] | None, unsupported({})] = None
    presence_penalty: Annotated[float | None, unsupported(0.0)] = None
    frequency_penalty: Annotated[float | None, unsupported(0.0)] = None
    prediction: Annotated[Json | None, unsupported()] = None
    web_search_options: Annotated[Json | None, unsupported()] = None
    reasoning_effort: Annotated[str | None, unsupported()] = None
    verbosity: Annotated[str | None, unsupported()] = None
    moderation: Annotated[Json | None, unsupported()] = None

    @field_validator("temperature")
    @classmethod
    def _tiny_temperature_is_greedy(cls, v: float | None) -> float | None:
        # logits / 1e-300 overflow to inf (found by tests/serve/test_fuzz.py); sampling that
        # cold picks the argmax anyway.
        return 0.0 if v is not None and v < GREEDY_BELOW else v


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
