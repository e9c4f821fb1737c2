"""The chunk types that cross stage boundaries: thinker -> talker -> code2wav -> ingress.

Each stage emits a stream of chunks per request. The streaming convention, the same on every edge:

* `seq` counts 0, 1, 2, ... per request on one edge, with no gaps, so a consumer can detect loss
  or reordering.
* Exactly one chunk per request has `finished=True`: the last one. It may carry no new data
  (empty `token_ids`, zero frames, zero samples).
* `finish_reason` is `NONE` on every chunk except possibly the last; errors and aborts are sent as a
  final chunk with `ERROR`/`ABORT`, never by dropping the stream.

The classes are plain slotted dataclasses (no stray attributes, cheap to build) and are treated as
immutable once sent. `validate()` checks types, shapes and dtypes; the codec calls it on encode and
decode, so a malformed chunk fails at the producer rather than deep inside a consumer. Classes that
hold tensors use `eq=False`, because field-wise `==` on tensors is ambiguous; compare fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from omni_ray.payload.errors import PayloadError


class FinishReason(enum.IntEnum):
    """Why a request's stream ended. Int rather than str for compact serialization."""

    NONE = 0  # not finished (every chunk but the last)
    STOP = 1  # end of sequence (eos token, or the codec's end-of-speech code)
    LENGTH = 2  # max tokens / max frames reached
    ABORT = 3  # cancelled by the client or the server
    ERROR = 4  # the stage failed this request


@dataclass(kw_only=True, slots=True, eq=False)
class ThinkerChunk:
    """Thinker -> talker: new text tokens, plus the prompt context the talker conditions on.

    One per thinker step in async_chunk mode, exactly one (seq 0, finished) in sync mode.
    """

    request_id: str
    seq: int  # 0, 1, 2, ... per request on this edge
    token_ids: list[int]  # newly generated text token ids in this chunk (may be empty)
    finished: bool = False  # True on the last chunk of the request
    finish_reason: FinishReason = FinishReason.NONE
    # chunk 0 only: the full thinker prompt ids; the talker rebuilds its own prompt from them
    prompt_token_ids: list[int] | None = None
    # chunk 0 only: [n_mm, hidden] accept-layer hidden rows at the multimodal prompt positions, any
    # float dtype (bf16 included); the talker needs them because it cannot re-encode audio/images
    mm_hidden: torch.Tensor | None = None
    # chunk 0 only, with mm_hidden: the multimodal layout the talker's mrope positions follow
    image_grid_thw: torch.Tensor | None = None  # [n_images, 3] int64 (t, h, w patches)
    audio_feature_lengths: torch.Tensor | None = None  # [n_audios] int64 mel frames

    def validate(self) -> None:
        """Raise `PayloadError` (with the field name as `path`) if any field is malformed."""
        _validate_common(self)
        _check_token_ids("token_ids", self.token_ids)
        if self.image_grid_thw is not None:
            _check_tensor("image_grid_thw", self.image_grid_thw, ndim=2, dtype=torch.int64)
            if self.image_grid_thw.shape[1] != 3:
                raise PayloadError(f"expected [n, 3], got {tuple(self.image_grid_thw.shape)}",
                                   path="image_grid_thw")
            _check_first_chunk_only("image_grid_thw", self.seq)
        if self.audio_feature_lengths is not None:
            _check_tensor("audio_feature_lengths", self.audio_feature_lengths, ndim=1,
                          dtype=torch.int64)
            _check_first_chunk_only("audio_feature_lengths", self.seq)
        if self.prompt_token_ids is not None:
            _check_token_ids("prompt_token_ids", self.prompt_token_ids)
            _check_first_chunk_only("prompt_token_ids", self.seq)
        if self.mm_hidden is not None:
            _check_tensor("mm_hidden", self.mm_hidden, ndim=2)
            if not self.mm_hidden.is_floating_point():
                raise PayloadError(
                    f"expected a floating dtype, got {self.mm_hidden.dtype}", path="mm_hidden"
                )
            _check_first_chunk_only("mm_hidden", self.seq)


@dataclass(kw_only=True, slots=True, eq=False)
class CodecChunk:
    """Talker -> code2wav: a run of consecutive codec frames of one request."""

    request_id: str
    seq: int  # 0, 1, 2, ... per request on this edge
    start_frame: int  # index of the first frame of `codes` in the request's frame stream
    # [frames, num_code_groups] int64 codec codes, CPU; frames may be 0 on the final chunk
    codes: torch.Tensor
    finished: bool = False  # True on the last chunk of the request
    finish_reason: FinishReason = FinishReason.NONE

    def validate(self) -> None:
        """Raise `PayloadError` (with the field name as `path`) if any field is malformed."""
        _validate_common(self)
        _check_int("start_frame", self.start_frame, minimum=0)
        _check_tensor("codes", self.codes, ndim=2, dtype=torch.int64)
        if self.codes.device.type != "cpu":
            raise PayloadError(f"expected a CPU tensor, got {self.codes.device}", path="codes")


@dataclass(kw_only=True, slots=True, eq=False)
class AudioChunk:
    """Code2wav -> ingress: a run of consecutive waveform samples of one request."""

    request_id: str
    seq: int  # 0, 1, 2, ... per request on this edge
    start_sample: int  # index of samples[0] in the request's waveform
    samples: torch.Tensor  # [n] float32 mono waveform at `sample_rate`; n may be 0 when finished
    sample_rate: int = 24000  # Hz; Qwen3-Omni's code2wav emits 24 kHz
    finished: bool = False  # True on the last chunk of the request
    finish_reason: FinishReason = FinishReason.NONE

    def validate(self) -> None:
        """Raise `PayloadError` (with the field name as `path`) if any field is malformed."""
        _validate_common(self)
        _check_int("start_sample", self.start_sample, minimum=0)
        _check_tensor("samples", self.samples, ndim=1, dtype=torch.float32)
        _check_int("sample_rate", self.sample_rate, minimum=1)


@dataclass(kw_only=True, slots=True)
class TextDelta:
    """Thinker -> ingress: newly generated text token ids, for text streaming."""

    request_id: str
    seq: int  # 0, 1, 2, ... per request on this edge
    token_ids: list[int]  # newly generated text token ids (may be empty)
    finished: bool = False  # True on the last chunk of the request
    finish_reason: FinishReason = FinishReason.NONE
    num_prompt_tokens: int = 0  # thinker prompt length, for the OpenAI `usage` block

    def validate(self) -> None:
        """Raise `PayloadError` (with the field name as `path`) if any field is malformed."""
        _validate_common(self)
        _check_token_ids("token_ids", self.token_ids)
        _check_int("num_prompt_tokens", self.num_prompt_tokens, minimum=0)


Chunk = ThinkerChunk | CodecChunk | AudioChunk | TextDelta

# Class name -> class; the codec tags chunks by class name and decodes only these.
CHUNK_TYPES: dict[str, type] = {
    cls.__name__: cls for cls in (ThinkerChunk, CodecChunk, AudioChunk, TextDelta)
}


def _validate_common(chunk: Chunk) -> None:
    """Check the four fields every chunk has."""
    if type(chunk.request_id) is not str or not chunk.request_id:
        raise PayloadError(
            f"expected a non-empty str, got {chunk.request_id!r}", path="request_id"
        )
    _check_int("seq", chunk.seq, minimum=0)
    if type(chunk.finished) is not bool:
        raise PayloadError(f"expected bool, got {type(chunk.finished).__name__}", path="finished")
    if type(chunk.finish_reason) is not FinishReason:
        raise PayloadError(
            f"expected FinishReason, got {chunk.finish_reason!r}", path="finish_reason"
        )
    if chunk.finish_reason is not FinishReason.NONE and not chunk.finished:
        raise PayloadError(
            f"{chunk.finish_reason.name} given on a chunk with finished=False", path="finish_reason"
        )


def _check_int(field: str, value: object, *, minimum: int) -> None:
    """A plain int (bool rejected: it is an int subclass but never a count) >= `minimum`."""
    if type(value) is not int:
        raise PayloadError(f"expected int, got {type(value).__name__}", path=field)
    if value < minimum:
        raise PayloadError(f"expected >= {minimum}, got {value}", path=field)


def _check_token_ids(field: str, value: object) -> None:
    """A list of non-negative plain ints."""
    if type(value) is not list:
        raise PayloadError(f"expected list[int], got {type(value).__name__}", path=field)
    for i, token in enumerate(value):
        if type(token) is not int or token < 0:
            raise PayloadError(
                f"expected a non-negative int token id, got {token!r}", path=f"{field}[{i}]"
            )


def _check_first_chunk_only(field: str, seq: int) -> None:
    """Prompt context travels once, on chunk 0; repeating it would waste bandwidth."""
    if seq != 0:
        raise PayloadError(f"only allowed on chunk 0, got it on seq={seq}", path=field)


def _check_tensor(
    field: str, value: object, *, ndim: int, dtype: torch.dtype | None = None
) -> None:
    """A dense (strided) torch.Tensor with `ndim` dims and, if given, exactly `dtype`."""
    if not isinstance(value, torch.Tensor):
        raise PayloadError(f"expected torch.Tensor, got {type(value).__name__}", path=field)
    if value.layout is not torch.strided:
        raise PayloadError(f"expected a dense tensor, got layout {value.layout}", path=field)
    if value.dim() != ndim:
        raise PayloadError(
            f"expected {ndim}-D, got shape {tuple(value.shape)}", path=field
        )
    if dtype is not None and value.dtype != dtype:
        raise PayloadError(f"expected {dtype}, got {value.dtype}", path=field)
