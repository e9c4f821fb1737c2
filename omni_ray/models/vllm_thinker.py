"""vLLM's Qwen3-Omni thinker, plus a copy of the talker's accept-layer rows that survives
torch.compile and CUDA graphs.

The talker conditions on the thinker's hidden states after decoder layer ``accept_hidden_layer``
at the audio / image positions of the prompt (transformers' ``hidden_states[accept_hidden_layer]``:
the layer's output, before any deepstack addition). vLLM has no API for intermediate hidden
states. A Python forward hook would not run inside a compiled or graph-replayed forward, so this
model (registered by omni_ray's vLLM plugin; the runner selects it through ``hf_overrides``) makes
the copy part of the forward itself: after that layer, one custom op (``vllm::omni_ray_stash_rows``,
declared as mutating its buffer, so it is neither dropped nor reordered by the compiler) writes
the layer's output rows of the step into a preallocated buffer ``omni_rows``
[max_num_batched_tokens, hidden]. That is one device copy per forward, recorded into CUDA graphs
like any other kernel. ``runners/vllm/hidden.py`` reads the rows it needs after the forward.
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerForConditionalGeneration,
)
from vllm.utils.torch_utils import direct_register_custom_op

CAPTURE_LAYER_KEY = "omni_ray_capture_layer"  # hf_overrides key: the 1-based layer to copy


def _stash_rows(hidden: torch.Tensor, residual: torch.Tensor, out: torch.Tensor) -> None:
    """``out[:tokens] = hidden + residual`` (the decoder layer's output)."""
    torch.add(hidden, residual, out=out[: hidden.shape[0]])


def _stash_rows_fake(hidden: torch.Tensor, residual: torch.Tensor, out: torch.Tensor) -> None:
    return None


direct_register_custom_op("omni_ray_stash_rows", _stash_rows, mutates_args=["out"],
                          fake_impl=_stash_rows_fake)


class OmniRayQwen3OmniThinkerForConditionalGeneration(
        Qwen3OmniMoeThinkerForConditionalGeneration):
    """vLLM's thinker; with ``hf_overrides[CAPTURE_LAYER_KEY] = k`` every forward also copies
    decoder layer ``k``'s output rows into the buffer ``omni_rows()`` returns (module doc)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._omni_layer = None
        k = getattr(vllm_config.model_config.hf_config, CAPTURE_LAYER_KEY, None)
        if not k:
            return
        layer = self.language_model.model.layers[k - 1]
        # Built under vLLM's loader context: default dtype and device are the model's.
        layer.register_buffer("omni_rows", torch.zeros(
            vllm_config.scheduler_config.max_num_batched_tokens,
            self.config.text_config.hidden_size), persistent=False)
        forward = layer.forward

        def forward_and_stash(positions, hidden_states, residual):
            hidden_states, residual = forward(positions, hidden_states, residual)
            torch.ops.vllm.omni_ray_stash_rows(hidden_states, residual, layer.omni_rows)
            return hidden_states, residual

        layer.forward = forward_and_stash  # before vLLM compiles the model: traced with it
        self._omni_layer = layer

    def omni_rows(self) -> torch.Tensor | None:
        """The buffer the last forward wrote (its first rows: that step's tokens, in batch
        order); None without a capture layer."""
        return None if self._omni_layer is None else self._omni_layer.omni_rows
