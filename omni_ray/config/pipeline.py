"""How stages hand work to each other: delivery mode and codec chunking."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from omni_ray.config.defaults import (DEFAULT_CODE2WAV_MAX_BATCH, DEFAULT_CODE2WAV_MODE,
                                      DEFAULT_MODE)

Mode = Literal["sync", "async_chunk"]
# The fields a running Serve app can change (``POST /debug/pipeline``; gpu_check's A/B variants
# of only these run on the base's engines, no restart): each is read per request, message or step
# by the stage engine or logic, not built into a runner at its start.
LIVE_FIELDS = ("coalesce_pushes", "stream_interval_ms", "text_chunk_ms", "max_chunks_in_flight",
               "code2wav_urgent_ms", "hold_first_chunk_above", "code2wav_step_graphs")


class PipelineConfig(BaseModel):
    """Delivery between stages.

    * ``sync``: a stage starts a request when the previous stage finished it (one chunk per edge).
    * ``async_chunk``: the talker starts on the thinker's first tokens; code2wav decodes codec
      chunks as they arrive: ``initial_chunk_frames`` first (small, for a fast first audio), then
      every ``chunk_frames`` (with ``ramp_chunks``: growing with the audio sent, ``ramp_ratio``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = DEFAULT_MODE
    initial_chunk_frames: int = Field(4, ge=1, le=1000)
    chunk_frames: int = Field(25, ge=1, le=1000)
    ramp_chunks: bool = Field(False, description="chunks after the first grow with the audio "
                                                 "already sent (ramp_ratio) up to chunk_frames")
    ramp_ratio: float = Field(
        1.0, gt=0, le=8,
        description="with ramp_chunks, each chunk after the first has ramp_ratio x the frames "
                    "already sent (rounded up), up to chunk_frames. 1: 1, 1, 2, 4, 8, ... "
                    "frames; a chunk then takes no longer to make than the audio already out "
                    "lasts at any real-time factor below 1 (2: 1, 2, 6, 18, ...; below 0.5)")
    first_chunks_first: bool = Field(
        True, description="code2wav decodes requests' first chunks in a step of their own, "
                          "before the later chunks of others (time to first audio under load)")
    hold_first_chunk_above: int = Field(
        0, ge=0, le=4096,
        description="async_chunk: when a request's first codec chunk is made while the "
                    "talker has more than this many requests (under load every stage's queue "
                    "is longer, and a stream that starts with one small chunk runs dry before "
                    "its next), the chunk waits for the request's second and both go "
                    "together: its playback starts with both buffered, its first audio that "
                    "much later. The chunks and the audio do not change. Needs ramp_chunks "
                    "(a second chunk as small as the first). 0: off")
    code2wav_urgent_ms: float = Field(
        0.0, ge=0, le=10000,
        description="with first_chunks_first: after the first chunks, code2wav decodes the "
                    "chunks of requests whose audio sent so far plays out within this many ms "
                    "(a player starting at the first audio) in a step before the others' "
                    "(0: only requests already late). A stream's early chunks, with a frame or "
                    "two of audio ahead, then skip the queue of streams with seconds in hand")
    code2wav_max_batch: int | None = Field(
        None, ge=1, le=1024,
        description="code2wav decodes up to this many requests' chunks in one forward "
                    "(stateful mode). 1: one forward per chunk. Unset: "
                    f"{DEFAULT_CODE2WAV_MAX_BATCH} where code2wav runs in bfloat16/float16, 1 in "
                    "float32: a batched forward rounds the last float bits differently from a "
                    "request's forward alone, and float32 is the exact reference (a request's "
                    "audio never depends on its neighbours)")
    code2wav_pad_shapes: bool | None = Field(
        None, description="stateful code2wav pads each eager forward up to a few shapes (the "
                          "batch to 1, 2, 4, ... code2wav's batch; the frames to 1, 2, 4, ... "
                          "and the chunk sizes) and runs each once at start: on a GPU a forward "
                          "of a shape met first builds its convolutions' kernels (~100 ms against "
                          "~30 ms on an H100). The audio does not change (padding is discarded), "
                          "up to float rounding. Unset: on where code2wav batches (bf16/fp16; "
                          "code2wav_max_batch), off in float32, the exact reference")
    code2wav_step_graphs: bool = Field(
        True, description="with code2wav_pad_shapes, on a GPU: code2wav's padded forwards whose "
                          "rows all carry state (no request's first chunk) replay a CUDA graph "
                          "per (batch, frames), captured and checked against the eager forward "
                          "at start (~10 s). Eager, such a step of a few rows is launch-bound: "
                          "on an H200 a replay took 6.7-30 ms where the padded eager forward "
                          "took 15-39 ms (benchmarks/README.md, session 34). No effect in "
                          "float32 or on CPU (no padding there). Live: off in a running app, "
                          "the steps run eager; on again, they replay the graphs captured at "
                          "start (none where it started off)")
    code2wav_mode: Literal["window", "stateful"] = Field(
        DEFAULT_CODE2WAV_MODE,
        description="stateful: carry attention/conv state, exact for any chunking (default); "
                    "window: re-decode left_context_frames each chunk")
    left_context_frames: int = Field(25, ge=1, le=2000,
                                     description="left context for code2wav_mode=window")
    text_chunk_ms: float = Field(
        20.0, ge=0, le=1000,
        description="async_chunk: the thinker's text goes to the talker at most once per this "
                    "many ms per request (the first token at once; 0: every token as it comes). "
                    "The talker speaks ~12.5 tokens a second: fewer, larger pushes cost it less")
    stream_interval_ms: float = Field(
        20.0, ge=0, le=1000,
        description="Serve app: a stage engine sends a request's items to the ingress at most "
                    "once per this many ms, all that is queued in one message (the first item "
                    "at once; 0: each as it comes). Text comes faster than anyone reads it: "
                    "one hop per token costs the engines' cores more than it gives")
    coalesce_pushes: bool = Field(
        True, description="Serve app: an engine sends the chunks its requests push to the next "
                          "stage in one call per receiving engine and turn of its event loop "
                          "(false: one call per chunk). At 32 streams the thinker pushed ~550 "
                          "chunks a second into the talker; each call runs Python under the GIL "
                          "the receiver's step thread needs (benchmarks/push_fanin_bench.py)")
    max_chunks_in_flight: int = Field(8, ge=1, le=1024,
                                      description="per request and edge, before the sender waits")

    @field_validator("hold_first_chunk_above")
    @classmethod
    def _hold_needs_ramp(cls, v: int, info: ValidationInfo) -> int:
        # without the ramp the second chunk is chunk_frames long: holding the first for it
        # would delay the first audio by that much (25 frames: 0.8 s at c=8 on the CPU box)
        if v and not info.data.get("ramp_chunks"):
            raise ValueError("needs ramp_chunks: true (the second chunk is then as small as "
                             "the first)")
        return v

    def tuned(self, fields: dict) -> PipelineConfig:
        """This config with ``fields`` changed, for a running app: ``LIVE_FIELDS`` only (the
        requests that start after take them). ValueError naming the field otherwise (a pydantic
        ``ValidationError`` for a bad value)."""
        fixed = sorted(set(fields) - set(LIVE_FIELDS))
        if fixed:
            raise ValueError(f"pipeline.{fixed[0]} cannot change in a running app (it is built "
                             f"into a runner at its start); these can: {', '.join(LIVE_FIELDS)}")
        return PipelineConfig.model_validate({**self.model_dump(), **fields})

    def code2wav_shapes(self, dtype: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The (batch sizes, frame counts) stateful code2wav pads its eager forwards to, for a
        code2wav in ``dtype`` (``code2wav_pad_shapes``), or None: no padding."""
        batch = self.code2wav_batch(dtype)
        pad = self.code2wav_pad_shapes if self.code2wav_pad_shapes is not None else batch > 1
        if not pad or self.code2wav_mode != "stateful":
            return None
        return (_sizes_up_to(batch),
                _sizes_up_to(self.chunk_frames, (self.initial_chunk_frames,)))

    def code2wav_batch(self, dtype: str) -> int:
        """``code2wav_max_batch``, or its default for a code2wav in ``dtype`` ("float32", ...)."""
        if self.code2wav_max_batch is not None:
            return self.code2wav_max_batch
        return 1 if dtype == "float32" else DEFAULT_CODE2WAV_MAX_BATCH


def _sizes_up_to(largest: int, extra: tuple[int, ...] = ()) -> tuple[int, ...]:
    """1, 2, 4, ... below ``largest``, ``largest`` itself and the ``extra`` sizes up to it."""
    powers = {1 << i for i in range(largest.bit_length()) if 1 << i < largest}
    return tuple(sorted(powers | {largest} | {e for e in extra if 0 < e <= largest}))
