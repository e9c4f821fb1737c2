"""Talker runner (transformers backend): codec frames from the thinker's text, step by step.

Per request the talker consumes the thinker's stream (prompt ids, then generated ids as they
come) and produces one codec frame (16 codes) per decode step:

* prefill (9 assistant positions after the user turns): needs the first generated text token;
* decode step ``k`` feeds the projected embedding of "trailing text" entry ``k``: the assistant
  stream ``a = prompt[assistant_start:] + generated`` gives ``a[4 + k]`` while that is not the
  last token, ``tts_eos`` at the last token, ``tts_pad`` after it (the last generated token is
  never spoken, exactly as transformers' ``generate`` does it).

A request whose next entry is not yet determined WAITS (it is skipped by ``step``): the talker
never decodes on missing input. When the thinker is slower, the talker simply waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason
from omni_ray.runners.sampling import make_generator, sample_token

ASSISTANT_HEADER = 3  # "<|im_start|>assistant\n"


@dataclass
class TalkerStepOutput:
    request_id: str
    frames: torch.Tensor          # [n, 16] int64: frames produced this step (n is 0 or 1)
    finished: bool
    finish_reason: FinishReason
    error: str | None = None  # set when this request failed (finish_reason ERROR)


@dataclass
class _Seq:
    request_id: str
    speaker_id: int
    params: SamplingParams
    max_frames: int
    generator: torch.Generator | None
    prompt_ids: list[int] | None = None
    mm_hidden: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None  # multimodal layout, for the mrope positions
    audio_feature_lengths: torch.Tensor | None = None
    rope_delta: int = 0  # mrope offset of decode positions (0 for text-only prompts)
    text_ids: list[int] = field(default_factory=list)
    text_finished: bool = False
    assistant_start: int = -1
    cache: object = None
    gen_step: int = 0                 # decode steps done (= frames produced)
    codec_ids: list[int] = field(default_factory=list)  # sampled codebook-0 tokens
    past_hidden: torch.Tensor | None = None

    @property
    def stream(self) -> list[int]:
        """The assistant stream a = prompt[assistant_start:] + generated ids."""
        return self.prompt_ids[self.assistant_start:] + self.text_ids

    def ready(self) -> bool:
        if self.prompt_ids is None:
            return False
        n = len(self.stream)
        if self.cache is None:  # prefill needs a[3], the first generated token
            return n > ASSISTANT_HEADER or self.text_finished
        return self.text_finished or n > ASSISTANT_HEADER + 1 + self.gen_step + 1


class TalkerRunner:
    """Step loop that owns the talker (with its code predictor)."""

    def __init__(self, talker, text_embedding, config, *, max_num_seqs: int = 64,
                 device: str = "cpu", batch_code_predictor: bool | None = None):
        self.model = talker
        self.embed_text = text_embedding  # thinker's token embedding table
        self.cfg = config                 # Qwen3OmniMoeConfig
        tc = config.talker_config
        self.num_code_groups = tc.num_code_groups
        self.codec_eos = tc.codec_eos_token_id
        self.speakers = {k.lower(): v for k, v in tc.speaker_id.items()}
        vocab = tc.text_config.vocab_size
        self.suppress = torch.tensor([i for i in range(vocab - 1024, vocab) if i != self.codec_eos])
        self.mm_token_ids = {config.thinker_config.audio_token_id, config.thinker_config.image_token_id,
                             config.thinker_config.video_token_id}
        self.max_num_seqs = max_num_seqs
        self.device = device
        # One batched code-predictor pass per step for all decoding requests. Off on CPU by
        # default: batching changes GEMM shapes, so float32 results may differ in the last bits
        # from a request decoded alone; on GPU the speed matters more.
        self.batch_code_predictor = (str(device).startswith("cuda") if batch_code_predictor is None
                                     else batch_code_predictor)
        self._seqs: dict[str, _Seq] = {}
        with torch.inference_mode():
            special = torch.tensor([[config.tts_bos_token_id, config.tts_eos_token_id,
                                     config.tts_pad_token_id]], device=device)
            proj = self.model.text_projection(self.embed_text(special))
            self.tts_bos, self.tts_eos, self.tts_pad = proj[:, 0:1], proj[:, 1:2], proj[:, 2:3]

    # -- request lifecycle -------------------------------------------------------------------
    def add_request(self, request_id: str, speaker: str, params: SamplingParams,
                    max_frames: int) -> None:
        if request_id in self._seqs:
            raise ValueError(f"duplicate request_id {request_id!r}")
        speaker_id = self.speakers.get(speaker.lower())
        if speaker_id is None:
            raise ValueError(f"unknown speaker {speaker!r}; known: {sorted(self.speakers)}")
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        self._seqs[request_id] = _Seq(request_id, speaker_id, params, max_frames,
                                      make_generator(params))

    def push_text(self, request_id: str, token_ids: list[int], finished: bool,
                  prompt_token_ids: list[int] | None = None,
                  mm_hidden: torch.Tensor | None = None,
                  image_grid_thw: torch.Tensor | None = None,
                  audio_feature_lengths: torch.Tensor | None = None) -> None:
        """Deliver thinker output; the first delivery carries the prompt."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise KeyError(request_id)
        if seq.text_finished:
            raise ValueError(f"{request_id}: text delivered after the thinker finished")
        if prompt_token_ids is not None:
            if seq.prompt_ids is not None:
                raise ValueError(f"{request_id}: prompt delivered twice")
            seq.prompt_ids = list(prompt_token_ids)
            seq.mm_hidden = mm_hidden
            seq.image_grid_thw, seq.audio_feature_lengths = image_grid_thw, audio_feature_lengths
            seq.assistant_start = _assistant_start(seq.prompt_ids, self.cfg)
        elif seq.prompt_ids is None:
            raise ValueError(f"{request_id}: text delivered before the prompt")
        seq.text_ids.extend(token_ids)
        seq.text_finished = finished

    def abort(self, request_id: str) -> bool:
        return self._seqs.pop(request_id, None) is not None

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    def has_ready(self) -> bool:
        return any(s.ready() for s in self._seqs.values())

    @property
    def num_requests(self) -> int:
        return len(self._seqs)

    def request_ids(self) -> list[str]:
        return list(self._seqs)

    # -- the step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[TalkerStepOutput]:
        outputs = []
        ready = [s for s in self._seqs.values() if s.ready()][: self.max_num_seqs]
        # 1) Code predictor for the decoding requests: one batch (same shapes for every request).
        residual = {}
        decoding = [s for s in ready if s.cache is not None]
        if self.batch_code_predictor and len(decoding) > 1:
            try:
                residual = self._residual_codes_batch(decoding)
            except Exception:  # fall back to one request at a time, which isolates the failure
                residual = {}
        # 2) Talker backbone, request by request (each owns its KV cache).
        for seq in ready:
            frames = torch.empty((0, self.num_code_groups), dtype=torch.long)
            try:
                if seq.cache is None:
                    self._prefill(seq)
                else:
                    frames = self._decode(seq, residual.get(seq.request_id))
            except Exception as e:  # one request's failure never touches the others
                del self._seqs[seq.request_id]
                outputs.append(TalkerStepOutput(seq.request_id, frames, True, FinishReason.ERROR,
                                                f"{type(e).__name__}: {e}"))
                continue
            reason = FinishReason.NONE
            if seq.codec_ids and seq.codec_ids[-1] == self.codec_eos:
                reason = FinishReason.STOP
            elif seq.gen_step >= seq.max_frames:
                reason = FinishReason.LENGTH
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
        token = sample_token(out.logits[0, -1], seq.params, seq.codec_ids, self.suppress,
                             seq.generator)
        seq.codec_ids.append(token)

    def _prefill(self, seq: _Seq) -> None:
        from transformers import DynamicCache

        user = self._user_part(seq)
        assistant = self._assistant_part(seq)
        embeds = torch.cat([user, assistant], dim=1) if user is not None else assistant
        seq.cache = DynamicCache(config=self.model.config.text_config)
        self._forward(seq, embeds, 0, self._mm_positions(seq, assistant.shape[1]))

    def _mm_positions(self, seq: _Seq, assistant_len: int) -> torch.Tensor | None:
        """3-D mrope positions of a multimodal prompt (user turns + assistant part), as
        transformers' talker computes them; sets the decode offset ``rope_delta``."""
        if seq.image_grid_thw is None and seq.audio_feature_lengths is None:
            return None
        user_ids = [seq.prompt_ids[p] for p in _user_positions(seq.prompt_ids, self.cfg)]
        ids = torch.tensor([user_ids + [self.cfg.tts_pad_token_id] * assistant_len])
        rope, delta = self.model.get_rope_index(ids, seq.image_grid_thw, None,
                                                torch.ones_like(ids), False,
                                                seq.audio_feature_lengths)
        seq.rope_delta = int(delta.reshape(-1)[0])
        return rope.to(self.device)

    def _decode(self, seq: _Seq, residual=None) -> torch.Tensor:
        k = seq.gen_step
        frame, codec_embed = residual if residual is not None else self._residual_codes(seq)
        embeds = codec_embed + self._trailing(seq, k)
        seq.gen_step += 1
        self._forward(seq, embeds, seq.cache.get_seq_length())
        return frame

    def _residual_codes(self, seq: _Seq) -> tuple[torch.Tensor, torch.Tensor]:
        """Code predictor: codebooks 1..15 for the last token; returns the frame and the summed
        embedding of its 16 codes (the next talker input, before the text part)."""
        from transformers import DynamicCache

        cp = self.model.code_predictor
        last = torch.tensor([[seq.codec_ids[-1]]], device=self.device)
        last_embed = self.model.get_input_embeddings()(last)
        cache = DynamicCache(config=cp.config)
        out = cp(inputs_embeds=torch.cat([seq.past_hidden, last_embed], dim=1), cache=cache,
                 use_cache=True)
        codes = [seq.codec_ids[-1]]
        embed_sum = last_embed
        cp_params = _code_predictor_params(seq.params)
        for step in range(1, self.num_code_groups):
            code = sample_token(out.logits[0, -1], cp_params, None, None, seq.generator)
            codes.append(code)
            code_t = torch.tensor([[code]], device=self.device)
            embed_sum = embed_sum + cp.get_input_embeddings()[step - 1](code_t)
            if step < self.num_code_groups - 1:
                out = cp(input_ids=code_t, cache=out.cache, use_cache=True, generation_steps=step)
        return torch.tensor([codes], dtype=torch.long), embed_sum

    def _residual_codes_batch(self, seqs: list[_Seq]) -> dict:
        """``_residual_codes`` for several requests in one batch: {request_id: (frame, embed)}."""
        from transformers import DynamicCache

        cp = self.model.code_predictor
        last = torch.tensor([[s.codec_ids[-1]] for s in seqs], device=self.device)
        last_embed = self.model.get_input_embeddings()(last)                 # [B, 1, D]
        past = torch.cat([s.past_hidden for s in seqs], dim=0)               # [B, 1, D]
        out = cp(inputs_embeds=torch.cat([past, last_embed], dim=1),
                 cache=DynamicCache(config=cp.config), use_cache=True)
        codes = [last[:, 0]]
        embed_sum = last_embed
        params = [_code_predictor_params(s.params) for s in seqs]
        for step in range(1, self.num_code_groups):
            logits = out.logits[:, -1]
            if all(p.greedy for p in params):
                code = logits.argmax(-1)
            else:
                code = torch.tensor([sample_token(logits[i], p, None, None, s.generator)
                                     for i, (p, s) in enumerate(zip(params, seqs))],
                                    device=self.device)
            codes.append(code)
            code_t = code.view(-1, 1)
            embed_sum = embed_sum + cp.get_input_embeddings()[step - 1](code_t)
            if step < self.num_code_groups - 1:
                out = cp(input_ids=code_t, cache=out.cache, use_cache=True, generation_steps=step)
        frames = torch.stack(codes, dim=1).to("cpu", torch.long)            # [B, 16]
        return {s.request_id: (frames[i:i + 1], embed_sum[i:i + 1]) for i, s in enumerate(seqs)}

    def _trailing(self, seq: _Seq, k: int) -> torch.Tensor:
        a = seq.stream
        idx = ASSISTANT_HEADER + 1 + k
        if idx < len(a) - 1 or (not seq.text_finished):
            if idx >= len(a) - 1:
                raise RuntimeError(f"{seq.request_id}: trailing text {k} not available")
            return self._project_text([a[idx]])
        last = max(len(a) - 2 - ASSISTANT_HEADER, 0)  # step that speaks tts_eos
        return self.tts_eos if k == last else self.tts_pad

    def _project_text(self, ids: list[int]) -> torch.Tensor:
        t = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self.model.text_projection(self.embed_text(t))

    def _user_part(self, seq: _Seq) -> torch.Tensor | None:
        ids = seq.prompt_ids
        user_pos = _user_positions(ids, self.cfg)
        if not user_pos:
            return None
        rows = []
        mm_iter = 0
        for p in user_pos:
            if ids[p] in self.mm_token_ids:
                if seq.mm_hidden is None or mm_iter >= seq.mm_hidden.shape[0]:
                    raise ValueError(f"{seq.request_id}: multimodal prompt without hidden states")
                rows.append(self.model.hidden_projection(
                    seq.mm_hidden[mm_iter:mm_iter + 1].to(self.device)))
                mm_iter += 1
            else:
                rows.append(self._project_text([ids[p]])[0])
        return torch.cat(rows, dim=0).unsqueeze(0)

    def _assistant_part(self, seq: _Seq) -> torch.Tensor:
        tc = self.cfg.talker_config
        a = seq.stream
        head = self._project_text(a[:ASSISTANT_HEADER + 1])  # header + first text token
        text = torch.cat([head[:, :3], self.tts_pad.expand(1, 4, -1), self.tts_bos, head[:, 3:4]],
                         dim=1)
        codec_ids = torch.tensor([[tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id,
                                   seq.speaker_id, tc.codec_pad_id, tc.codec_bos_id]],
                                 device=self.device)
        codec = torch.cat([torch.zeros_like(text[:, :3]),
                           self.model.get_input_embeddings()(codec_ids)], dim=1)
        return text + codec


def _code_predictor_params(params: SamplingParams) -> SamplingParams:
    """transformers mirrors the talker's do_sample onto the code predictor (top-k 50, top-p 0.8)."""
    if params.greedy:
        return SamplingParams()
    return SamplingParams(temperature=1.0, top_k=50, top_p=0.8)


def _assistant_start(ids: list[int], cfg) -> int:
    """Index of the last ``<|im_start|>assistant`` in the prompt."""
    for i in range(len(ids) - 2, -1, -1):
        if ids[i] == cfg.im_start_token_id and ids[i + 1] == cfg.assistant_token_id:
            return i
    raise ValueError("prompt must end with an '<|im_start|>assistant' turn")


def _user_positions(ids: list[int], cfg) -> list[int]:
    """Positions inside user turns (the role token after the last <|im_start|> is 'user')."""
    out, role = [], None
    for i, t in enumerate(ids):
        if t == cfg.im_start_token_id:
            role = ids[i + 1] if i + 1 < len(ids) else None
        if role == cfg.user_token_id:
            out.append(i)
    return out
