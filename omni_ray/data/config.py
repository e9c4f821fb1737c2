"""What a batch job over a Ray Dataset runs: the checkpoint, each stage's engine, actor pool and
batch size, the output audio's encoding and the per-row defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from omni_ray.config.defaults import DEFAULT_MAX_AUDIO_FRAMES, DEFAULT_MAX_TOKENS, DEFAULT_SPEAKER
from omni_ray.config.serving import LimitsConfig, StageConfig

AudioFormat = Literal["float32", "flac", "wav", "mp3", "opus", "aac", "pcm16"]


class DataStageConfig(BaseModel):
    """One stage as a Ray Data operator: ``concurrency`` actors (an int, or (min, max) for an
    autoscaling pool), each holding one engine built from ``engine`` (the Serve app's
    ``StageConfig``: backend, device, dtype, engine_kwargs; ``engine_resources`` are each actor's
    CPUs and GPUs) and stepping ``batch_size`` rows at a time together."""

    model_config = ConfigDict(extra="forbid")

    engine: StageConfig = Field(default_factory=StageConfig)
    concurrency: int | tuple[int, int] = 1
    batch_size: int = Field(16, ge=1)


class OmniProcessorConfig(BaseModel):
    """``build_omni_processor``'s configuration (the shape of ``ray.data.llm``'s processor
    configs: one per stage here, since each stage is its own operator)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("tiny", description="checkpoint dir, Hugging Face hub id, or 'tiny'")
    revision: str | None = None
    allow_dummy_weights: bool = False
    max_model_len: int = Field(8192, ge=16)
    audio: bool = Field(True, description="False: text only (no talker or code2wav operators; "
                                          "rows asking for audio get an error)")
    thinker: DataStageConfig = Field(default_factory=DataStageConfig)
    talker: DataStageConfig = Field(default_factory=DataStageConfig)
    code2wav: DataStageConfig = Field(default_factory=DataStageConfig)
    audio_format: AudioFormat = Field(
        "flac", description="the `audio` column: float32 samples (an array) or encoded bytes "
                            "(flac: lossless 16-bit, the default)")
    default_voice: str = DEFAULT_SPEAKER
    default_max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    default_max_audio_frames: int = Field(DEFAULT_MAX_AUDIO_FRAMES, ge=1)
    limits: LimitsConfig = Field(default_factory=LimitsConfig,
                                 description="per-row input limits (audio seconds, image pixels)")


def from_serving_args(sa, *, batch_size: int = 16, concurrency: int = 1,
                      audio_format: AudioFormat = "flac", audio: bool = True
                      ) -> OmniProcessorConfig:
    """The batch job for what a Serve config (``OmniServingArgs``) serves: the same checkpoint,
    engines, limits and default voice; ``concurrency`` actors per stage, ``batch_size`` rows."""
    stage = {s: DataStageConfig(engine=getattr(sa, s), batch_size=batch_size,
                                concurrency=concurrency) for s in ("thinker", "talker", "code2wav")}
    return OmniProcessorConfig(
        model=sa.model, revision=sa.revision, allow_dummy_weights=sa.allow_dummy_weights,
        max_model_len=sa.max_model_len, audio=audio, audio_format=audio_format,
        default_voice=sa.default_speaker, default_max_tokens=sa.limits.default_max_tokens,
        default_max_audio_frames=sa.limits.default_max_audio_frames, limits=sa.limits, **stage)
