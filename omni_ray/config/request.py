"""One request as every stage sees it (validated at the edge, passed down unchanged)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from omni_ray.config.defaults import DEFAULT_MAX_AUDIO_FRAMES, DEFAULT_MAX_TOKENS, DEFAULT_SPEAKER
from omni_ray.config.sampling import THINKER_GREEDY, TALKER_GREEDY, SamplingParams
from omni_ray.payload.mm import MultiModalInputs

Modality = Literal["text", "audio"]


# Request ids of the ingress's warm-up requests (ingress/warmup.py); engines count them.
# ``add_request``'s ``downstream`` when the next stage's engine is not known yet: the stage opens
# at once and buffers its chunks until ``attach(request_id, engine)`` (stages/engine.py).
DOWNSTREAM_LATER = "downstream-later"
WARMUP_ID_PREFIX = "warmup-"
# Warm-up requests for the stages' standby engines (stages/supervisor.py, ingress/warmup.py).
STANDBY_WARMUP_ID_PREFIX = WARMUP_ID_PREFIX + "standby-"


class OmniRequest(BaseModel):
    """A prompt (already tokenised with the chat template) and what to produce from it."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    request_id: str = Field(min_length=1, max_length=256)
    prompt_token_ids: list[int] = Field(min_length=1)
    modalities: tuple[Modality, ...] = ("text", "audio")
    speaker: str = DEFAULT_SPEAKER
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, description="max text tokens from the thinker")
    max_audio_frames: int = Field(DEFAULT_MAX_AUDIO_FRAMES, ge=1, description="max codec frames (80 ms each)")
    stop_token_ids: tuple[int, ...] = ()
    thinker_sampling: SamplingParams = THINKER_GREEDY
    talker_sampling: SamplingParams = TALKER_GREEDY
    # audio / image inputs of the prompt (the thinker's encoders read them); None for text only
    mm: MultiModalInputs | None = None
    # the thinker's answer given instead of generated (text to speech): the thinker stage emits
    # these ids as its answer without a model step, the talker and code2wav voice them. End them
    # with the stop token (the thinker's last token is never spoken: runners/transformers/talker_inputs.py).
    answer_token_ids: list[int] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "OmniRequest":
        if not self.modalities or len(set(self.modalities)) != len(self.modalities):
            raise ValueError(f"modalities must be a non-empty set of text/audio, got {self.modalities}")
        if self.mm is not None:
            self.mm.validate()
            if self.answer_token_ids is not None:  # the talker needs the thinker's hidden states
                raise ValueError("answer_token_ids cannot go with audio/image inputs")
        return self

    def without_media(self) -> "OmniRequest":
        """This request for the stages after the thinker: no encoder inputs (they get the
        thinker's hidden states instead)."""
        return self if self.mm is None else self.model_copy(update={"mm": None})

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.modalities
