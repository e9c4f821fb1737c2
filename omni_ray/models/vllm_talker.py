"""The Qwen3-Omni talker's backbone as a vLLM 0.26 model, and the scheduler that lets it wait.

Imported by vLLM only (it imports vLLM); ``omni_ray.models.vllm_plugin.register`` names it in
vLLM's model registry. What vLLM runs here is the talker's Qwen3-MoE backbone (with its shared
expert, vLLM's ``Qwen3MoeForCausalLM``) and its ``codec_head``: batched across requests, paged KV,
CUDA graphs on GPU. Everything else the talker does per step (code predictor, the thinker's text,
the multimodal projection) stays in omni_ray's runner and reaches vLLM through two hooks that
vLLM calls outside the compiled forward (runners/vllm/talker.py says which vLLM internals those
read):

* ``embed_input_ids``: vLLM asks for the embeddings of a step's token-id rows (with
  ``enable_prompt_embeds`` it does so eagerly, outside the CUDA graph). A decode row's token is
  the codebook-0 code sampled last step; the bridge returns the sum of that frame's 16 codebook
  embeddings plus the projected text for this step, running the code predictor for the frame.
* ``compute_logits``: the bridge keeps each request's last hidden state (the code predictor's
  input next step), suppresses the non-codec ids and applies the repetition penalty over the
  request's generated codes (transformers' rule; vLLM's own would also count the prompt).

``TalkerScheduler`` holds back running requests whose next text is not known yet (async_chunk:
the thinker is behind), so vLLM never decodes a talker step on missing input.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

import torch
from vllm.model_executor.models.qwen3_vl_moe import Qwen3MoeLLMForCausalLM
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

# checkpoint name prefix -> vLLM Qwen3MoeForCausalLM name prefix (first match wins)
_RENAMES = (
    ("talker.model.codec_embedding.", "model.embed_tokens."),
    ("talker.model.", "model."),
    ("talker.codec_head.", "lm_head."),
)


class OmniRayQwen3OmniTalkerForCausalLM(Qwen3MoeLLMForCausalLM):
    """Talker backbone + codec head; per-step inputs come from ``omni_bridge`` (see module doc).

    The talker uses 3-D (mrope) positions. Text-only prompts get three equal rows here; a
    multimodal prompt's rows come from the runner (transformers' ``get_rope_index`` on the
    prompt's layout), which hands them to vLLM's model runner for that request.

    The base is vLLM's Qwen3-MoE language model *as Qwen3-VL/Omni use it*
    (``Qwen3MoeLLMForCausalLM``): the same layers and weights as ``Qwen3MoeForCausalLM``, but
    compiled with the token count on the last dimension of ``positions`` ([3, tokens] under
    mrope). Plain ``Qwen3MoeForCausalLM`` marks dimension 0 (the 3) dynamic, so torch.compile
    specialised the token count and the compiled talker failed to build."""

    omni_bridge = None  # set by VllmTalkerRunner once the engine is up
    supports_mrope: ClassVar[Literal[True]] = True

    def get_mrope_input_positions(self, input_tokens, mm_features):
        n = len(input_tokens)
        return torch.arange(n).view(1, -1).expand(3, -1).clone(), 0

    def embed_input_ids(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.omni_bridge is None:  # vLLM's warm-up / profiling runs
            return super().embed_input_ids(input_ids)
        return self.omni_bridge.decode_embeds(input_ids, super().embed_input_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states)
        if self.omni_bridge is None or logits is None:
            return logits
        return self.omni_bridge.on_logits(hidden_states, logits)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Take the talker's backbone and codec head out of a whole Qwen3-Omni checkpoint."""

        def talker_only():
            for name, tensor in weights:
                for old, new in _RENAMES:
                    if name.startswith(old):
                        yield new + name[len(old):], tensor
                        break

        return super().load_weights(talker_only())


class TalkerScheduler(Scheduler):
    """vLLM's scheduler, minus running requests that ``omni_ready(request)`` says must wait.

    A held request keeps its KV blocks and its place; it is simply not scheduled this step, as if
    the token budget had run out before it (a state vLLM's scheduler handles every step)."""

    omni_ready = None  # set by VllmTalkerRunner: Request -> bool
    # set by VllmTalkerRunner (its ``time_spent``): what each step scheduled, summed over steps:
    # tokens, of them in rows of more than one token (prompt chunks), new requests, requests held
    # for their text, requests left waiting (the token budget or the batch was full)
    omni_counts: dict | None = None

    def schedule(self, *args, **kwargs):
        ready = self.omni_ready
        held = [r for r in self.running if not ready(r)] if ready is not None else []
        if not held:
            return self._count(super().schedule(*args, **kwargs), 0)
        held_ids = {id(r) for r in held}
        self.running = [r for r in self.running if id(r) not in held_ids]
        try:
            return self._count(super().schedule(*args, **kwargs), len(held))
        finally:
            self.running = held + self.running

    def _count(self, out, held: int):
        counts = self.omni_counts
        if counts is not None:
            counts["sched_tokens"] += out.total_num_scheduled_tokens
            counts["sched_prompt_tokens"] += sum(n for n in out.num_scheduled_tokens.values()
                                                 if n > 1)
            counts["sched_new"] += len(out.scheduled_new_reqs)
            counts["sched_held"] += held
            counts["sched_waiting"] += len(self.waiting) + len(self.skipped_waiting)
        return out


class AsyncTalkerScheduler(TalkerScheduler, AsyncScheduler):
    """``TalkerScheduler`` over vLLM's async scheduler (the talker's ``async_scheduling``): it
    schedules step k+1 before step k's codes are read, one output placeholder a request."""
