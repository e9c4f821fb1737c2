"""Thinker runner (transformers backend): continuous batching over per-request KV caches.

Each ``step()`` advances every running request by one token: a request that has not been
prefilled runs its prompt, the others decode one token. Requests join (``add_request``) and leave
(finish or ``abort``) between steps; each owns its ``DynamicCache``, so a request's tokens do not
depend on which others share the step.

Prefill/decode disaggregation: ``prefill_only`` runs a prompt and samples its first token without
registering the request (the prefill replica keeps the returned cache until it has saved it);
``add_prefilled`` registers a request whose KV was computed elsewhere: its next step emits the
given first token, then it decodes as usual, so its output equals an unsplit run's.

Audio / image prompts: the request carries the processor's encoder inputs (``MultiModalInputs``);
the prefill runs the thinker's audio and vision encoders, uses the prompt's 3-D mrope positions
(decode continues at ``rope_delta``) and keeps the ``accept_hidden_layer`` hidden states at the
multimodal positions for the talker (``MMContext`` on the request's first step output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason, MultiModalInputs
from omni_ray.runners.kv import Prefilled
from omni_ray.runners.sampling import make_generator, sample_token, stop_ids

if TYPE_CHECKING:
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.serving import StageConfig


@dataclass
class MMContext:
    """What the talker needs of a multimodal prompt (it rides on ThinkerChunk 0)."""

    hidden: torch.Tensor  # [n_mm, hidden] accept-layer hidden states at the multimodal positions
    image_grid_thw: torch.Tensor | None  # [n_images, 3] int64
    audio_feature_lengths: torch.Tensor | None  # [n_audios] int64


@dataclass
class ThinkerStepOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason
    num_prompt_tokens: int
    error: str | None = None  # set when this request failed (finish_reason ERROR)
    mm: MMContext | None = None  # on the prefill step of a multimodal prompt


@dataclass
class _Seq:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    output_ids: list[int] = field(default_factory=list)
    cache: object = None
    rope_delta: int = 0  # mrope offset of decode positions (0 for text-only prompts)
    first_token: int | None = None  # sampled by a prefill elsewhere; the next step emits it
    mm_inputs: MultiModalInputs | None = None  # encoder inputs, dropped after the prefill
    mm_out: MMContext | None = None  # made by the prefill, handed out once by ``step``

    @property
    def prefilled(self) -> bool:
        return self.cache is not None


class ThinkerRunner:
    """Step loop that owns the thinker module."""

    needs_raw_media = False  # media requests bring the processor's encoder inputs

    def __init__(self, thinker, *, eos_token_ids: list[int], max_num_seqs: int = 64,
                 device: str = "cpu", accept_hidden_layer: int | None = None):
        self.model = thinker
        self.eos_token_ids = frozenset(eos_token_ids)
        cfg = thinker.config
        self.mm_token_ids = torch.tensor([cfg.audio_token_id, cfg.image_token_id,
                                          cfg.video_token_id])
        self.accept_hidden_layer = accept_hidden_layer
        self.max_num_seqs = max_num_seqs
        self.device = device
        self._seqs: dict[str, _Seq] = {}

    @classmethod
    def from_config(cls, model_dir: str | Path, stage_cfg: StageConfig, *,
                    pipeline: PipelineConfig | None = None, kv_transfer: bool = False,
                    max_model_len: int | None = None) -> ThinkerRunner:
        """Load the checkpoint's thinker as ``stage_cfg`` says (device, dtype, ``max_num_seqs``).
        This runner can always hand its KV over (``kv_transfer``) and has no length limit of
        its own (``max_model_len``); ``pipeline`` is not its business."""
        from omni_ray.models.loading import load_stage

        th = load_stage(model_dir, "thinker", stage_cfg.device, getattr(torch, stage_cfg.dtype))
        return cls(th.module, eos_token_ids=[th.config.im_end_token_id],
                   max_num_seqs=stage_cfg.max_num_seqs, device=stage_cfg.device,
                   accept_hidden_layer=th.config.talker_config.accept_hidden_layer)

    # -- request lifecycle -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    max_tokens: int, stop_token_ids: list[int] | None = None,
                    mm: MultiModalInputs | None = None) -> None:
        if request_id in self._seqs:
            raise ValueError(f"duplicate request_id {request_id!r}")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if mm is not None:
            self._check_mm(prompt_ids, mm)
        stop = stop_ids(params, self.eos_token_ids, stop_token_ids)
        self._seqs[request_id] = _Seq(request_id, list(prompt_ids), params, max_tokens, stop,
                                      make_generator(params), mm_inputs=mm)

    def _check_mm(self, prompt_ids: list[int], mm: MultiModalInputs) -> None:
        """Placeholders in the prompt must match the inputs (else the encoders would fail
        mid-step); a talker downstream needs ``accept_hidden_layer``."""
        cfg = self.model.config
        n_audio = sum(1 for t in prompt_ids if t == cfg.audio_start_token_id)
        n_image = sum(1 for a, b in zip(prompt_ids, prompt_ids[1:])
                      if a == cfg.vision_start_token_id and b == cfg.image_token_id)
        if n_audio != mm.num_audios or n_image != mm.num_images:
            raise ValueError(f"the prompt has {n_audio} audio and {n_image} image placeholders, "
                             f"the inputs {mm.num_audios} audio and {mm.num_images} images")

    def add_prefilled(self, request_id: str, prompt_ids: list[int], first_token: int, cache,
                      params: SamplingParams, max_tokens: int,
                      stop_token_ids: list[int] | None = None, *,
                      rng_state: torch.Tensor | None = None, rope_delta: int = 0) -> None:
        """Register a request whose prompt KV (``cache``) and first token came from a prefill
        elsewhere. ``rng_state`` continues a seeded sampler exactly where the prefill left it."""
        self.add_request(request_id, prompt_ids, params, max_tokens, stop_token_ids)
        seq = self._seqs[request_id]
        try:
            if cache.get_seq_length() != len(seq.prompt_ids):
                raise ValueError(f"cache holds {cache.get_seq_length()} tokens, the prompt has "
                                 f"{len(seq.prompt_ids)}")
            if rng_state is not None and seq.generator is not None:
                seq.generator.set_state(rng_state)
        except BaseException:
            del self._seqs[request_id]  # nothing half-registered stays behind
            raise
        seq.cache, seq.first_token, seq.rope_delta = cache, int(first_token), rope_delta

    @torch.inference_mode()
    def prefill_only(self, prompt_ids: list[int], params: SamplingParams) -> Prefilled:
        """Run a prompt and sample its first token, exactly as ``step`` would, without
        registering the request; the caller owns (and frees) the returned cache."""
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        seq = _Seq("", list(prompt_ids), params, 1, frozenset(), make_generator(params))
        token = self._advance(seq)
        state = seq.generator.get_state() if seq.generator is not None else None
        return Prefilled(token, seq.cache, len(seq.prompt_ids), state, seq.rope_delta)

    @staticmethod
    def extract_kv(pre: Prefilled) -> torch.Tensor:
        """The portable KV ([layers, 2, kv_heads, tokens, head_dim], CPU) of a prefill."""
        from omni_ray.runners.kv import extract_prompt_kv

        return extract_prompt_kv(pre.cache, pre.num_tokens)

    def add_prefilled_kv(self, request_id: str, prompt_ids: list[int], first_token: int,
                         kv: torch.Tensor, params: SamplingParams, max_tokens: int,
                         stop_token_ids: list[int] | None = None, *,
                         rng_state: torch.Tensor | None = None, rope_delta: int = 0) -> None:
        """``add_prefilled`` from the portable KV layout (a fresh cache on this runner's
        device and dtype)."""
        from omni_ray.runners.kv import cache_from_kv

        param = next(self.model.parameters())
        cache = cache_from_kv(kv, self.model.config.get_text_config(), device=self.device,
                              dtype=param.dtype)
        self.add_prefilled(request_id, prompt_ids, first_token, cache, params, max_tokens,
                           stop_token_ids, rng_state=rng_state, rope_delta=rope_delta)

    def abort(self, request_id: str) -> bool:
        return self._seqs.pop(request_id, None) is not None

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    @property
    def num_requests(self) -> int:
        return len(self._seqs)

    def request_ids(self) -> list[str]:
        return list(self._seqs)

    # -- the step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[ThinkerStepOutput]:
        outputs = []
        for seq in list(self._seqs.values())[: self.max_num_seqs]:
            try:
                token = self._advance(seq)
            except Exception as e:  # one request's failure never touches the others
                del self._seqs[seq.request_id]
                outputs.append(ThinkerStepOutput(seq.request_id, [], True, FinishReason.ERROR,
                                                 len(seq.prompt_ids), f"{type(e).__name__}: {e}"))
                continue
            seq.output_ids.append(token)
            reason = FinishReason.NONE
            if token in seq.stop_ids:
                reason = FinishReason.STOP
            elif len(seq.output_ids) >= seq.max_tokens:
                reason = FinishReason.LENGTH
            finished = reason != FinishReason.NONE
            if finished:
                del self._seqs[seq.request_id]  # frees its KV cache
            mm, seq.mm_out = seq.mm_out, None
            outputs.append(ThinkerStepOutput(seq.request_id, [token], finished, reason,
                                             len(seq.prompt_ids), mm=mm))
        return outputs

    def _advance(self, seq: _Seq) -> int:
        from transformers import DynamicCache

        if seq.first_token is not None:  # prefilled elsewhere: emit its token, no model call
            token, seq.first_token = seq.first_token, None
            return token
        if not seq.prefilled:
            cache = DynamicCache(config=self.model.config.get_text_config())
            if seq.mm_inputs is not None:
                return self._prefill_mm(seq, cache)
            ids = seq.prompt_ids
            start = 0
            seq.cache = cache
        else:
            ids = seq.output_ids[-1:]
            start = len(seq.prompt_ids) + len(seq.output_ids) - 1
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, position_ids=_positions(start, len(ids), seq.rope_delta,
                                                                      self.device),
                         cache=seq.cache, use_cache=True)
        seq.cache = out.cache
        return sample_token(out.logits[0, -1], seq.params, seq.output_ids, None, seq.generator)

    def _prefill_mm(self, seq: _Seq, cache) -> int:
        """Prefill a prompt with audio / images: encoders, 3-D mrope positions, accept-layer
        hidden states at the multimodal positions (as transformers' generate() computes them)."""
        mm = seq.mm_inputs
        input_ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self.device)
        audio_lengths = mm.audio_feature_lengths()
        rope, delta = self.model.get_rope_index(
            input_ids, mm.image_grid_thw, None, torch.ones_like(input_ids), False,
            audio_lengths)
        text = torch.arange(input_ids.shape[1], device=self.device).view(1, 1, -1)
        position_ids = torch.cat([text, rope.to(self.device)], dim=0)
        want_hidden = self.accept_hidden_layer is not None
        out = self.model(input_ids=input_ids, position_ids=position_ids, cache=cache,
                         use_cache=True, output_hidden_states=want_hidden,
                         **mm.model_kwargs(self.device))
        seq.cache, seq.rope_delta, seq.mm_inputs = out.cache, int(delta.reshape(-1)[0]), None
        if want_hidden:
            mask = torch.isin(input_ids[0].cpu(), self.mm_token_ids)
            hidden = out.hidden_states[self.accept_hidden_layer][0][mask.to(self.device)]
            seq.mm_out = MMContext(hidden.detach().cpu(), mm.image_grid_thw, audio_lengths)
        return sample_token(out.logits[0, -1], seq.params, seq.output_ids, None, seq.generator)


def _positions(start: int, length: int, rope_delta: int, device) -> torch.Tensor:
    """[4, 1, length] position ids: text positions, then the 3 mrope rows (text-only prompt)."""
    text = torch.arange(start, start + length, device=device).view(1, 1, -1)
    return torch.cat([text, (text + rope_delta).expand(3, 1, -1)], dim=0)
