"""The KV-transfer payload: a request's prompt KV, moved from a prefill replica to a decode one.

Not a stage-edge chunk (it is not in ``CHUNK_TYPES``: it never flows thinker -> talker), but it
follows the same convention (``seq``, ``finished``, ``finish_reason``) and the codec encodes it
like one, losslessly, any dtype. Today one chunk carries the whole prompt (``seq=0``,
``finished=True``); ``seq`` leaves room for streaming the KV layer group by layer group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_ray.payload.chunks import FinishReason, _check_int, _check_tensor, _validate_common
from omni_ray.payload.errors import PayloadError


@dataclass(kw_only=True, slots=True, eq=False)
class KVChunk:
    """Prefill -> decode: the prompt's KV of one request, plus the first sampled token."""

    request_id: str
    # [layers, 2 (key, value), kv_heads, num_tokens, head_dim], any float dtype, CPU, contiguous
    kv: torch.Tensor
    num_tokens: int  # prompt tokens the KV covers (== kv.shape[3])
    first_token: int  # sampled by the prefill from the prompt's last logits
    # [n] uint8: the request's sampling generator state after the first draw, so seeded sampling
    # continues exactly as on one replica; None for greedy or unseeded requests
    rng_state: torch.Tensor | None = None
    rope_delta: int = 0  # mrope offset of decode positions (0 for text-only prompts)
    seq: int = 0
    finished: bool = True
    finish_reason: FinishReason = FinishReason.NONE

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def validate(self) -> None:
        """Raise `PayloadError` (with the field name as `path`) if any field is malformed."""
        _validate_common(self)
        _check_tensor("kv", self.kv, ndim=5)
        if not self.kv.is_floating_point():
            raise PayloadError(f"expected a floating dtype, got {self.kv.dtype}", path="kv")
        if self.kv.device.type != "cpu":
            raise PayloadError(f"expected a CPU tensor, got {self.kv.device}", path="kv")
        if self.kv.shape[1] != 2:
            raise PayloadError(f"dim 1 must be 2 (key, value), got shape {tuple(self.kv.shape)}",
                               path="kv")
        _check_int("num_tokens", self.num_tokens, minimum=1)
        if self.kv.shape[3] != self.num_tokens:
            raise PayloadError(f"covers {self.kv.shape[3]} tokens, num_tokens={self.num_tokens}",
                               path="kv")
        _check_int("first_token", self.first_token, minimum=0)
        if type(self.rope_delta) is not int:
            raise PayloadError(f"expected int, got {type(self.rope_delta).__name__}",
                               path="rope_delta")
        if self.rng_state is not None:
            _check_tensor("rng_state", self.rng_state, ndim=1, dtype=torch.uint8)
