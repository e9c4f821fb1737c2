"""Talker runner (transformers backend): codec frames from the thinker's text, step by step.

Each request's inputs (prefill embeddings, the code predictor, the trailing text) are built by
``TalkerInputs`` (runners/transformers/talker_inputs.py, which also says what the talker consumes and when a
request must wait); this runner owns the backbone: one transformers KV cache per request, one
request-forward at a time, the code predictor batched across requests on GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from omni_ray.payload import FinishReason
from omni_ray.runners.sampling import sample_token
from omni_ray.runners.start_phases import StartPhases
from omni_ray.runners.transformers.talker_inputs import (  # noqa: F401 - re-exported
    ASSISTANT_HEADER, TalkerInputs, TalkerRequests, TalkerSeq, TalkerStepOutput, user_positions)

if TYPE_CHECKING:
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.serving import StageConfig

_Seq = TalkerSeq


class TalkerRunner(TalkerRequests):
    """Step loop that owns the talker (with its code predictor)."""

    def __init__(self, talker, text_embedding, config, *, max_num_seqs: int = 64,
                 device: str = "cpu", batch_code_predictor: bool = True,
                 compile_graphs: bool = False, fused_code_predictor: bool = False):
        self.model = talker
        self.cfg = config                 # Qwen3OmniMoeConfig
        self.inputs = TalkerInputs(talker, text_embedding, config, device,
                                   compile_graphs=compile_graphs,
                                   fused_code_predictor=fused_code_predictor)
        self.num_code_groups = self.inputs.num_code_groups
        self.max_num_seqs = max_num_seqs
        self.device = device
        # One batched code-predictor pass per step for all decoding requests (on CPU only where
        # each request's result is bitwise its result alone: TalkerInputs.can_batch).
        self.batch_code_predictor = batch_code_predictor and self.inputs.can_batch
        self._seqs: dict[str, _Seq] = {}
        self.start_phases = StartPhases()

    def warm_up(self) -> None:
        """The code predictor's CUDA graphs, captured now (``make_runner`` calls this; the Serve
        engine after its GPU start turn: stages/gpu_start.py)."""
        with self.start_phases.timed("code_predictor_warmup_s"):
            parts = self.inputs.warm_up(self.max_num_seqs)
        self.start_phases.update(parts)  # of code_predictor_warmup: runs, captures

    @classmethod
    def from_config(cls, model_dir: str | Path, stage_cfg: StageConfig, *,
                    pipeline: PipelineConfig | None = None, kv_transfer: bool = False,
                    max_model_len: int | None = None) -> TalkerRunner:
        """Load the checkpoint's talker (and the thinker's token embedding) as ``stage_cfg``
        says; ``pipeline``, ``kv_transfer`` and ``max_model_len`` do not apply to it."""
        from omni_ray.models.loading import load_stage

        tk = load_stage(model_dir, "talker", stage_cfg.device, getattr(torch, stage_cfg.dtype))
        return cls(tk.module, tk.text_embedding, tk.config, max_num_seqs=stage_cfg.max_num_seqs,
                   device=stage_cfg.device, compile_graphs=stage_cfg.compile_graphs,
                   fused_code_predictor=stage_cfg.fused_code_predictor)

    # -- request lifecycle -------------------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        return self._seqs.pop(request_id, None) is not None

    # -- the step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[TalkerStepOutput]:
        outputs = []
        ready = [s for s in self._seqs.values() if s.ready()][: self.max_num_seqs]
        # 1) Code predictor for the decoding requests: one batch (same shapes for every request).
        residual = {}
        decoding = [s for s in ready if s.prefilled]
        if self.batch_code_predictor and decoding:
            try:
                residual = self._residual_codes_batch(decoding)
            except Exception:  # fall back to one request at a time, which isolates the failure
                residual = {}
        # 2) Talker backbone, request by request (each owns its KV cache).
        for seq in ready:
            frames = torch.empty((0, self.num_code_groups), dtype=torch.long)
            try:
                if not seq.prefilled:
                    self._prefill(seq)
                else:
                    frames = self._decode(seq, residual.get(seq.request_id))
            except Exception as e:  # one request's failure never touches the others
                del self._seqs[seq.request_id]
                outputs.append(TalkerStepOutput(seq.request_id, frames, True, FinishReason.ERROR,
                                                f"{type(e).__name__}: {e}"))
                continue
            reason = self.inputs.finish_reason(seq)
            if reason != FinishReason.NONE:
                del self._seqs[seq.request_id]
            outputs.append(TalkerStepOutput(seq.request_id, frames, reason != FinishReason.NONE,
                                            reason))
        return outputs

    def _forward(self, seq: _Seq, embeds: torch.Tensor, start: int,
                 positions: torch.Tensor | None = None) -> None:
        """Run the talker backbone on ``embeds`` [1, L, D] (mrope ``positions`` [3, 1, L] if
        given); sample the next codebook-0 token."""
        length = embeds.shape[1]
        text = torch.arange(start, start + length, device=self.device).view(1, 1, -1)
        rope = positions if positions is not None else (text + seq.rope_delta).expand(3, 1, -1)
        pos = torch.cat([text, rope], dim=0)
        out = self.model(inputs_embeds=embeds, position_ids=pos, cache=seq.cache, use_cache=True,
                         output_hidden_states=True, generation_step=seq.gen_step - 1)
        seq.cache = out.cache
        seq.past_hidden = out.hidden_states[0][-1][:, -1:]
        token = sample_token(out.logits[0, -1], seq.params, seq.codec_ids,
                             self.inputs.suppressed(seq.params), seq.generator)
        seq.codec_ids.append(token)

    def _prefill(self, seq: _Seq) -> None:
        from transformers import DynamicCache

        embeds, assistant_len = self.inputs.prefill_embeds(seq)
        seq.cache = DynamicCache(config=self.model.config.text_config)
        self._forward(seq, embeds, 0, self._mm_positions(seq, assistant_len))
        seq.prefilled = True

    def _mm_positions(self, seq: _Seq, assistant_len: int) -> torch.Tensor | None:
        """3-D mrope positions of a multimodal prompt (user turns + assistant part), as
        transformers' talker computes them; sets the decode offset ``rope_delta``."""
        return self.inputs.mm_positions(seq, assistant_len)

    def _decode(self, seq: _Seq, residual=None) -> torch.Tensor:
        frame, codec_embed = residual if residual is not None else self._residual_codes(seq)
        embeds = codec_embed + self.inputs.trailing_batch([seq])
        seq.gen_step += 1
        self._forward(seq, embeds, seq.cache.get_seq_length())
        return frame

    def _residual_codes(self, seq: _Seq) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs.residual_codes(seq)

    def _residual_codes_batch(self, seqs: list[_Seq]) -> dict:
        return self.inputs.residual_codes_batch(seqs)
