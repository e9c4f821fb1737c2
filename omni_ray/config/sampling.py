"""Per-stage sampling parameters (validated once, passed down explicitly)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """How a stage picks its next token. ``temperature == 0`` means greedy.

    Processing order follows transformers' ``generate``: repetition penalty and suppressed ids
    first, then temperature, top-k and top-p.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(0.0, ge=0.0, le=10.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    seed: int | None = Field(None, description="per-request seed for sampling; None: unseeded")
    ignore_eos: bool = Field(False, description="never end at the stage's own end token (the "
                                                "thinker's end of turn, the talker's codec end): "
                                                "run to max_tokens / max_audio_frames, as vLLM's "
                                                "ignore_eos; for benchmarks of fixed lengths")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# Stage defaults that reproduce transformers' Qwen3OmniMoeForConditionalGeneration.generate()
# when it is called with greedy decoding (the tiny checkpoint's oracle).
THINKER_GREEDY = SamplingParams()
TALKER_GREEDY = SamplingParams(repetition_penalty=1.05)
