"""The subset of OpenAI's Chat Completions API that omni_ray serves (text and audio out)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag,
                      WithJsonSchema, field_validator)
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


def Unsupported(tp: Any, *no_ops: Any) -> Any:  # noqa: N802 - used as a type
    """A field this server does not honour: ``tp`` or null, accepted only with a value that asks
    for nothing (null, the OpenAI default, an empty list), refused otherwise with a 400 saying
    so. The OpenAPI schema lists exactly the accepted values."""
    accepted = ", ".join(["null", *map(json.dumps, no_ops)])

    def check(v: Any) -> Any:
        if v is None or v in no_ops:  # strict types first: True never stands for 1 here
            return v
        raise PydanticCustomError("unsupported_parameter",
                                  "not supported by this server (accepted only as {accepted})",
                                  {"accepted": accepted})

    schema = {"enum": [None, *no_ops], "description": f"not supported; accepted: {accepted}"}
    return Annotated[tp | None, AfterValidator(check), WithJsonSchema(schema)]


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


def _part_tag(v: Any) -> str | None:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"part[{t}]" if isinstance(t, str) else None


# Tags in brackets: ingress/errors.py leaves them out of ``param`` (messages.0.content.1.text).
ContentPart = Annotated[
    Union[Annotated[TextPart, Tag("part[text]")], Annotated[InputAudioPart, Tag("part[input_audio]")],
          Annotated[ImageURLPart, Tag("part[image_url]")]],
    Discriminator(_part_tag, custom_error_type="invalid_content_part",
                  custom_error_message="a content part's type must be 'text', 'input_audio' or "
                                       "'image_url'")]
Json = Any  # a JSON value whose shape this server does not read (refused unless a no-op)


class AssistantAudio(Strict):
    """An earlier spoken answer, by the ``audio.id`` this server gave it (multi-turn)."""

    id: str


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[ContentPart] | None = None
    name: str | None = Field(None, description="accepted and ignored")
    # Assistant turns with tool calls need features this server lacks.
    tool_calls: Unsupported(list[Json], []) = None
    function_call: Unsupported(Json) = None
    audio: AssistantAudio | None = Field(None, description="assistant turns: an earlier spoken "
                                         "answer's id; its transcript becomes the turn's text")
    refusal: str | None = Field(None, description="accepted and ignored")


class AudioParams(Strict):
    voice: str
    format: Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"] = Field(
        "wav", description="streamed answers: pcm16 only")


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
    ignore_eos: bool | None = Field(None, description="omni_ray extension (vLLM's): the answer "
                                    "runs to max_tokens and its audio to max_audio_frames, past "
                                    "the model's end tokens; for benchmarks of fixed lengths")
    # Harmless: accepted, nothing to do.
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Json] | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # Not honoured: refused unless the value asks for nothing.
    n: Unsupported(int, 1) = None
    store: Unsupported(bool, False) = None
    tools: Unsupported(list[Json], []) = None
    tool_choice: Unsupported(Json, "none") = None
    parallel_tool_calls: Unsupported(bool) = None
    functions: Unsupported(list[Json], []) = None
    function_call: Unsupported(Json, "none") = None
    response_format: Unsupported(Json, {"type": "text"}) = None
    stop: Unsupported(str | list[str], []) = None
    logprobs: Unsupported(bool, False) = None
    top_logprobs: Unsupported(int, 0) = None
    logit_bias: Unsupported(dict[str, Json], {}) = None
    presence_penalty: Unsupported(float, 0.0) = None
    frequency_penalty: Unsupported(float, 0.0) = None
    prediction: Unsupported(Json) = None
    web_search_options: Unsupported(Json) = None
    reasoning_effort: Unsupported(str) = None
    verbosity: Unsupported(str) = None
    moderation: Unsupported(Json) = None

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
