"""The subset of OpenAI's Chat Completions API that omni_ray serves (text and audio out)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator


def _utf8(text: str) -> str:
    """JSON may carry lone surrogates (``"\\ud800"``) that no tokenizer can take: a 400 here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode text (a lone surrogate at character {e.start})") \
            from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class InputAudio(BaseModel):
    data: str = Field(description="base64 audio")
    format: Literal["wav", "mp3"]


class InputAudioPart(BaseModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ImageURLPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[Union[TextPart, InputAudioPart, ImageURLPart], Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[ContentPart] | None = None


class AudioParams(BaseModel):
    voice: str
    format: Literal["wav", "pcm16"] = "wav"


class StreamOptions(BaseModel):
    include_usage: bool = False


GREEDY_BELOW = 1e-5  # temperatures under this are sampled as 0 (greedy)


class ChatCompletionRequest(BaseModel):
    """Unknown fields are ignored, as OpenAI-compatible servers usually do."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParams | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    max_audio_frames: int | None = Field(None, ge=1, description="omni_ray extension: 80 ms frames")
    temperature: float | None = Field(None, ge=0.0, le=2.0,
                                      description=f"below {GREEDY_BELOW} means 0 (greedy)")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, description="int64")
    n: int = Field(1, ge=1, le=1)

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
