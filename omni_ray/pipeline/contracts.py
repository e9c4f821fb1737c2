"""What the stage logic needs of a runner: one ``Protocol`` per runner kind.

Each holds exactly what ``pipeline/`` calls (``ThinkerLogic``, ``TalkerLogic``, ``Code2WavLogic``,
the KV logics, ``LocalPipeline``), so a backend is any class with these methods: the transformers
runners (``runners/transformers/thinker.py``, ``talker.py``, ``code2wav.py``) and the vLLM ones
(``runners/vllm/thinker.py``, ``talker.py``). tests/pipeline/test_contracts.py checks every
backend against them at run time, tests/pipeline/test_types.py with mypy (signatures and return
types; ``step`` returns a ``Sequence``, read-only, so a list of the backend's own output class
conforms); tests/pipeline/test_core.py drives the logic with fakes that satisfy them.

Request bookkeeping the runners also offer (``request_ids``, ``has_unfinished`` on the talker,
``shutdown``) is not part of the contract: the logic does not call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from omni_ray.config.sampling import SamplingParams
    from omni_ray.payload import FinishReason, MultiModalInputs


class ThinkerStepOutputLike(Protocol):
    """One request's result of a thinker step (``runners.transformers.thinker.ThinkerStepOutput``)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason
    num_prompt_tokens: int
    error: str | None                 # the request failed (it is gone from the runner)
    mm: Any                           # MMContext on the prefill step of a multimodal prompt


class TalkerStepOutputLike(Protocol):
    """One request's result of a talker step (``runners.transformers.talker_inputs.TalkerStepOutput``)."""

    request_id: str
    frames: torch.Tensor              # [n, num_code_groups] int64, n is 0 or 1
    finished: bool
    finish_reason: FinishReason
    error: str | None


@runtime_checkable
class ThinkerRunnerProtocol(Protocol):
    """Text LLM: one token per running request per ``step``."""

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    max_tokens: int, stop_token_ids: list[int] | None = None,
                    mm: MultiModalInputs | None = None) -> None: ...
    def step(self) -> Sequence[ThinkerStepOutputLike]: ...
    def has_unfinished(self) -> bool: ...
    def abort(self, request_id: str) -> bool: ...
    @property
    def num_requests(self) -> int: ...


@runtime_checkable
class KVThinkerRunnerProtocol(ThinkerRunnerProtocol, Protocol):
    """A thinker that can run a prompt alone and hand its KV over (``pipeline/kv.py``)."""

    def prefill_only(self, prompt_ids: list[int], params: SamplingParams) -> Any: ...
    def extract_kv(self, pre: Any) -> torch.Tensor: ...
    def add_prefilled_kv(self, request_id: str, prompt_ids: list[int], first_token: int,
                         kv: torch.Tensor, params: SamplingParams, max_tokens: int,
                         stop_token_ids: list[int] | None = None, *,
                         rng_state: torch.Tensor | None = None, rope_delta: int = 0) -> None: ...


@runtime_checkable
class TalkerRunnerProtocol(Protocol):
    """Codec LM: thinker text in (``push_text``), one codec frame per ready request per step."""

    num_code_groups: int

    def check_request(self, speaker: str, max_frames: int) -> None: ...  # any thread
    def add_request(self, request_id: str, speaker: str, params: SamplingParams,
                    max_frames: int) -> None: ...
    def push_text(self, request_id: str, token_ids: list[int], finished: bool,
                  prompt_token_ids: list[int] | None = None,
                  mm_hidden: torch.Tensor | None = None,
                  image_grid_thw: torch.Tensor | None = None,
                  audio_feature_lengths: torch.Tensor | None = None) -> None: ...
    def has_ready(self) -> bool: ...
    def step(self) -> Sequence[TalkerStepOutputLike]: ...
    def abort(self, request_id: str) -> bool: ...
    @property
    def num_requests(self) -> int: ...


@runtime_checkable
class Code2WavRunnerProtocol(Protocol):
    """Vocoder: codec frames in, waveform samples out, per request and in order."""

    dtype: str  # its weights' ("float32", "bfloat16", ...): PipelineConfig.code2wav_batch
    def add_request(self, request_id: str) -> None: ...
    def decode_many(self, items: list[tuple[str, torch.Tensor]]
                    ) -> list[tuple[int, torch.Tensor] | Exception]: ...
    def finish(self, request_id: str) -> None: ...
    def abort(self, request_id: str) -> bool: ...
    @property
    def num_requests(self) -> int: ...
