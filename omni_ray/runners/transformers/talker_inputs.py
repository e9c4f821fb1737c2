"""What the talker's backbone consumes, built from the thinker's stream (shared by both backends).

Per request the talker reads the thinker's stream (prompt ids, then generated ids as they come)
and its backbone consumes:

* prefill (user turns + 9 assistant positions): needs the first generated text token;
* decode step ``k``: the summed embedding of frame ``k-1``'s 16 codes (codebook 0 sampled by the
  backbone, codebooks 1-15 by the code predictor) plus the projected embedding of "trailing text"
  entry ``k``: the assistant stream ``a = prompt[assistant_start:] + generated`` gives ``a[4 + k]``
  while that is not the last token, ``tts_eos`` at the last token, ``tts_pad`` after it (the last
  generated token is never spoken, exactly as transformers' ``generate`` does it).

A request whose next entry is not yet determined is not ``ready``: the talker never decodes on
missing input. ``TalkerRunner`` (transformers backbone) and ``VllmTalkerRunner`` (vLLM backbone)
both build their inputs here, from the same transformers modules, so they see the same numbers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason
from omni_ray.runners.sampling import make_generator, sample_token
from omni_ray.runners.transformers.batch_invariant import make_batch_invariant
from omni_ray.runners.transformers.code_predictor_sampling import code_predictor_params

logger = logging.getLogger(__name__)

ASSISTANT_HEADER = 3  # "<|im_start|>assistant\n"


def to_device(data, device, dtype=torch.long) -> torch.Tensor:
    """``data`` (Python numbers, nested lists) as a tensor on ``device``, without waiting on the
    GPU: on CUDA a pinned host copy sent non-blocking. A copy from pageable memory would first
    synchronize the stream, i.e. wait for every kernel queued before it (the code predictor's
    graph, vLLM's forward), leaving the GPU idle while Python prepares what comes next."""
    t = torch.tensor(data, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class TalkerStepOutput:
    request_id: str
    frames: torch.Tensor          # [n, 16] int64: frames produced this step (n is 0 or 1)
    finished: bool
    finish_reason: FinishReason
    error: str | None = None  # set when this request failed (finish_reason ERROR)


@dataclass
class TalkerSeq:
    """One request's talker state (the backbone's KV cache lives with the backend)."""

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
    prefilled: bool = False           # the backbone has run the prefill
    cache: object = None              # transformers backend: the request's KV cache
    gen_step: int = 0                 # decode steps done (= frames produced)
    codec_ids: list[int] = field(default_factory=list)  # sampled codebook-0 tokens
    past_hidden: torch.Tensor | None = None  # backbone's last hidden state [1, 1, D]
    seen_mask: torch.Tensor | None = None  # vLLM backend: codes seen, on the logits' device
    seen_marked: int = 0                   # how many of codec_ids the mask holds

    @property
    def stream(self) -> list[int]:
        """The assistant stream a = prompt[assistant_start:] + generated ids."""
        return self.prompt_ids[self.assistant_start:] + self.text_ids

    @property
    def multimodal(self) -> bool:
        return self.image_grid_thw is not None or self.audio_feature_lengths is not None

    def ready(self) -> bool:
        """Whether the next backbone step (prefill or decode ``gen_step``) has its input."""
        if self.prompt_ids is None:
            return False
        n = len(self.stream)
        if not self.prefilled:  # prefill needs a[3], the first generated token
            return n > ASSISTANT_HEADER or self.text_finished
        return self.text_finished or n > ASSISTANT_HEADER + 1 + self.gen_step + 1

    def deliver(self, token_ids: list[int], finished: bool, prompt_token_ids, mm_hidden,
                image_grid_thw, audio_feature_lengths, cfg) -> None:
        """Take thinker output; the first delivery carries the prompt."""
        if self.text_finished:
            raise ValueError(f"{self.request_id}: text delivered after the thinker finished")
        if prompt_token_ids is not None:
            if self.prompt_ids is not None:
                raise ValueError(f"{self.request_id}: prompt delivered twice")
            self.prompt_ids = list(prompt_token_ids)
            self.mm_hidden = mm_hidden
            self.image_grid_thw, self.audio_feature_lengths = image_grid_thw, audio_feature_lengths
            self.assistant_start = assistant_start(self.prompt_ids, cfg)
        elif self.prompt_ids is None:
            raise ValueError(f"{self.request_id}: text delivered before the prompt")
        self.text_ids.extend(token_ids)
        self.text_finished = finished


class TalkerInputs:
    """Builds the backbone's input embeddings and runs the code predictor.

    ``talker`` is transformers' ``Qwen3OmniMoeTalkerForConditionalGeneration``; only its
    ``model.codec_embedding``, ``code_predictor``, ``text_projection`` and ``hidden_projection``
    are used here. ``text_embedding`` is the thinker's token embedding table.
    """

    def __init__(self, talker, text_embedding, config, device: str = "cpu",
                 cuda_graphs: bool | None = None, compile_graphs: bool = False,
                 fused_code_predictor: bool = False):
        """``cuda_graphs`` (default: on for CUDA devices): batches of the code predictor replay a
        CUDA graph (runners/transformers/code_predictor_graph.py) instead of ~75 eager forwards;
        ``compile_graphs``: of its torch.compile'd decoder (``StageConfig.compile_graphs``);
        ``fused_code_predictor``: with its fused GEMMs (``StageConfig.fused_code_predictor``)."""
        self.model = talker
        self.embed_text = text_embedding
        self.cfg = config                 # Qwen3OmniMoeConfig
        self.device = device
        tc = config.talker_config
        self.num_code_groups = tc.num_code_groups
        self.codec_eos = tc.codec_eos_token_id
        self.speakers = {k.lower(): v for k, v in tc.speaker_id.items()}
        vocab = tc.text_config.vocab_size
        self.suppress = torch.tensor([i for i in range(vocab - 1024, vocab) if i != self.codec_eos])
        self._suppress_eos = torch.tensor(range(vocab - 1024, vocab))  # ... and the codec end
        th = config.thinker_config
        self.mm_token_ids = {th.audio_token_id, th.image_token_id, th.video_token_id}
        with torch.inference_mode():
            special = torch.tensor([[config.tts_bos_token_id, config.tts_eos_token_id,
                                     config.tts_pad_token_id]], device=device)
            proj = self.model.text_projection(self.embed_text(special))
            self.tts_bos, self.tts_eos, self.tts_pad = proj[:, 0:1], proj[:, 1:2], proj[:, 2:3]
            self._eos_pad = proj[0, 1:3]  # [2, D]: rows -2 and -1 of trailing_batch's table
        on_cuda = str(device).startswith("cuda")
        # Whether the code predictor may batch requests: on CUDA always (speed over last bits);
        # on CPU when, with each request's GEMMs its own, a batch's logits are bitwise each
        # request's alone on this machine (checked now; else one request at a time, as before).
        self.can_batch = on_cuda
        if not on_cuda:
            make_batch_invariant(talker.code_predictor)
            self.can_batch = self._batches_exactly()
            if not self.can_batch:
                logger.warning("code predictor: a batch's logits differ from one request's on "
                               "this CPU; it runs one request at a time")
        if cuda_graphs is None:
            cuda_graphs = on_cuda
        self.cp_graphs = None
        self._frames_copy = None  # residual_codes_batch(frames_later=True)'s pending host copy
        if cuda_graphs:
            from omni_ray.runners.transformers.code_predictor_graph import CodePredictorGraphs

            self.cp_graphs = CodePredictorGraphs(talker, device, self.tts_pad.dtype,
                                                 compile=compile_graphs,
                                                 fuse=fused_code_predictor)

    def _batches_exactly(self, batch: int = 4) -> bool:
        """Whether the code predictor, run over a frame's every step (the 2-token prefill, then
        one code a step: all the cache lengths it sees) on a random batch, gives each request
        bitwise the logits it gets alone."""
        from transformers import DynamicCache

        cp = self.model.code_predictor
        gen = torch.Generator().manual_seed(0)
        prefill = torch.randn(batch, 2, cp.config.hidden_size, generator=gen,
                              dtype=self.tts_pad.dtype).to(self.device)
        codes = torch.randint(0, cp.config.vocab_size, (batch, self.num_code_groups - 2),
                              generator=gen).to(self.device)

        def run(rows: slice) -> list[torch.Tensor]:
            out = cp(inputs_embeds=prefill[rows], cache=DynamicCache(config=cp.config),
                     use_cache=True)
            logits = [out.logits]
            for step in range(1, self.num_code_groups - 1):
                out = cp(input_ids=codes[rows, step - 1:step], cache=out.cache, use_cache=True,
                         generation_steps=step)
                logits.append(out.logits)
            return logits

        with torch.inference_mode():
            together = run(slice(None))
            return all(torch.equal(t[b:b + 1], a) for b in range(batch)
                       for t, a in zip(together, run(slice(b, b + 1))))

    def warm_up(self, max_batch: int) -> dict:
        """Capture the code predictor's CUDA graphs (greedy and sampled) for batches up to
        ``max_batch`` now, not under the first requests. Returns where the time went, for the
        runner's start phases (seconds; empty without graphs), and logs it with the compile
        cache's hits and misses: a second start on one machine should hit."""
        if self.cp_graphs is None:
            return {}
        from torch._dynamo.utils import counters

        before = dict(counters["inductor"])
        with torch.inference_mode():
            for sample in (False, True):
                self.cp_graphs.warm_up(max_batch, sample)
        t = self.cp_graphs.timing
        cache = {k: v - before.get(k, 0) for k, v in counters["inductor"].items()
                 if k.startswith("fxgraph_cache") and v != before.get(k, 0)}  # this warm-up's
        logging.getLogger("omni_ray").info(
            "code predictor graphs: %d captured; runs before them %.1f s (the decoder's "
            "compile is in the first), captures %.1f s; inductor cache %s (dir %s)",
            t["graphs"], t["runs_s"], t["captures_s"], cache or "unused",
            os.environ.get("TORCHINDUCTOR_CACHE_DIR", "default"))
        return dict(code_predictor_runs_s=round(t["runs_s"], 2),
                    code_predictor_captures_s=round(t["captures_s"], 2))

    def new_seq(self, request_id: str, speaker: str, params: SamplingParams,
                max_frames: int, generator) -> TalkerSeq:
        return TalkerSeq(request_id, self.speaker_id(speaker, max_frames), params, max_frames,
                         generator)

    def speaker_id(self, speaker: str, max_frames: int) -> int:
        """The codec id of ``speaker``; ValueError for an unknown one or ``max_frames`` < 1.
        Reads only what was fixed at start: any thread may call it."""
        speaker_id = self.speakers.get(speaker.lower())
        if speaker_id is None:
            raise ValueError(f"unknown speaker {speaker!r}; known: {sorted(self.speakers)}")
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        return speaker_id

    # -- prefill ---------------------------------------------------------------------------------
    def prefill_embeds(self, seq: TalkerSeq) -> tuple[torch.Tensor, int]:
        """[1, L, D]: the user turns (projected text; projected hidden states at multimodal
        positions) then the assistant positions; and how many of those there are (for
        ``mm_positions``)."""
        user = self.user_part(seq)
        assistant = self.assistant_part(seq)
        embeds = torch.cat([user, assistant], dim=1) if user is not None else assistant
        return embeds, assistant.shape[1]

    def user_part(self, seq: TalkerSeq) -> torch.Tensor | None:
        """[1, U, D]: the user turns' rows, as transformers builds them: one projection of all
        their text ids, one of all their multimodal hidden states (not one forward per
        position: a 2,000-token prompt would cost 2,000 small forwards on the talker's loop)."""
        ids = seq.prompt_ids
        user_pos = user_positions(ids, self.cfg)
        if not user_pos:
            return None
        is_mm = [ids[p] in self.mm_token_ids for p in user_pos]
        n_mm = sum(is_mm)
        if not n_mm:  # text only: one projection, no masked writes (a device sync each on GPU)
            return self.project_text([ids[p] for p in user_pos])
        if seq.mm_hidden is None or n_mm > seq.mm_hidden.shape[0]:
            raise ValueError(f"{seq.request_id}: multimodal prompt without hidden states")
        out = torch.empty((len(user_pos), self.tts_pad.shape[-1]), dtype=self.tts_pad.dtype,
                          device=self.device)
        is_mm = torch.tensor(is_mm).to(self.device)
        out[is_mm] = self.model.hidden_projection(seq.mm_hidden[:n_mm].to(self.device))
        if n_mm < len(user_pos):
            text = [ids[p] for p in user_pos if ids[p] not in self.mm_token_ids]
            out[~is_mm] = self.project_text(text)[0]
        return out.unsqueeze(0)

    def assistant_part(self, seq: TalkerSeq) -> torch.Tensor:
        tc = self.cfg.talker_config
        a = seq.stream
        head = self.project_text(a[:ASSISTANT_HEADER + 1])  # header + first text token
        text = torch.cat([head[:, :3], self.tts_pad.expand(1, 4, -1), self.tts_bos, head[:, 3:4]],
                         dim=1)
        codec_ids = to_device([[tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id,
                                seq.speaker_id, tc.codec_pad_id, tc.codec_bos_id]], self.device)
        codec = torch.cat([torch.zeros_like(text[:, :3]),
                           self.model.get_input_embeddings()(codec_ids)], dim=1)
        return text + codec

    def mm_positions(self, seq: TalkerSeq, assistant_len: int) -> torch.Tensor | None:
        """3-D mrope positions [3, 1, L] of a multimodal prompt (user turns + assistant part),
        as transformers' talker computes them; sets the decode offset ``seq.rope_delta``.
        None for a text-only prompt (its three rows would equal the 1-D positions)."""
        if not seq.multimodal:
            return None
        user_ids = [seq.prompt_ids[p] for p in user_positions(seq.prompt_ids, self.cfg)]
        ids = torch.tensor([user_ids + [self.cfg.tts_pad_token_id] * assistant_len])
        rope, delta = self.model.get_rope_index(ids, seq.image_grid_thw, None,
                                                torch.ones_like(ids), False,
                                                seq.audio_feature_lengths)
        seq.rope_delta = int(delta.reshape(-1)[0])
        return rope.to(self.device)

    # -- decode ----------------------------------------------------------------------------------
    def trailing_batch(self, seqs: list[TalkerSeq]) -> torch.Tensor:
        """[B, 1, D]: the projected text part of each request's next decode step (``gen_step``;
        see the module doc): one projection of all the text ids among them, then one gather
        with ``tts_eos`` / ``tts_pad`` for the rows past the text (not a slice per row)."""
        pick, ids = [], []  # pick: each row's index into [projected ids..., tts_eos, tts_pad]
        for seq in seqs:
            a, k = seq.stream, seq.gen_step
            idx = ASSISTANT_HEADER + 1 + k
            if idx < len(a) - 1 or not seq.text_finished:
                if idx >= len(a) - 1:
                    raise RuntimeError(f"{seq.request_id}: trailing text {k} not available")
                pick.append(len(ids))
                ids.append(a[idx])
            else:
                last = max(len(a) - 2 - ASSISTANT_HEADER, 0)  # the step that speaks tts_eos
                pick.append(-2 if k == last else -1)
        if len(ids) == len(seqs):  # every row text, in order
            return self.project_text(ids)[0].unsqueeze(1)
        table = torch.cat([self.project_text(ids)[0], self._eos_pad]) if ids else self._eos_pad
        return table[to_device(pick, table.device)].unsqueeze(1)

    def project_text(self, ids: list[int]) -> torch.Tensor:
        return self.model.text_projection(self.embed_text(to_device([ids], self.device)))

    def residual_codes(self, seq: TalkerSeq) -> tuple[torch.Tensor, torch.Tensor]:
        """Code predictor: codebooks 1..15 for the last token; returns the frame [1, 16] and the
        summed embedding [1, 1, D] of its 16 codes (the next input, before the text part)."""
        from transformers import DynamicCache

        cp = self.model.code_predictor
        last = torch.tensor([[seq.codec_ids[-1]]], device=self.device)
        last_embed = self.model.get_input_embeddings()(last)
        cache = DynamicCache(config=cp.config)
        out = cp(inputs_embeds=torch.cat([seq.past_hidden, last_embed], dim=1), cache=cache,
                 use_cache=True)
        codes = [seq.codec_ids[-1]]
        embed_sum = last_embed
        cp_params = code_predictor_params(seq.params)
        for step in range(1, self.num_code_groups):
            code = sample_token(out.logits[0, -1], cp_params, None, None, seq.generator)
            codes.append(code)
            code_t = torch.tensor([[code]], device=self.device)
            embed_sum = embed_sum + cp.get_input_embeddings()[step - 1](code_t)
            if step < self.num_code_groups - 1:
                out = cp(input_ids=code_t, cache=out.cache, use_cache=True, generation_steps=step)
        return torch.tensor([codes], dtype=torch.long), embed_sum

    def residual_codes_batch(self, seqs: list[TalkerSeq], frames_later: bool = False,
                             code0: torch.Tensor | None = None) -> dict:
        """``residual_codes`` for several requests in one batch: {request_id: (frame, embed)}.

        ``frames_later`` (the CUDA graphs' path): the frames' host copy is queued, not waited
        for, so the caller can queue more GPU work behind the code predictor; their values may
        be read only after ``frames_copied()`` (or the event ``take_frames_copy()`` hands out).
        ``code0`` [B] on the device: each request's codebook-0 code, when it is not yet in
        ``codec_ids`` (the vLLM talker's sampler hook). The results are the caller's to keep
        (the graphs hand out copies of their buffers)."""
        from transformers import DynamicCache

        greedy = all(s.params.greedy for s in seqs)
        unseeded = all(not s.params.greedy and s.params.seed is None for s in seqs)
        if self.cp_graphs is not None and (greedy or unseeded):
            past = torch.cat([s.past_hidden for s in seqs], dim=0)
            if code0 is None:
                code0 = to_device([s.codec_ids[-1] for s in seqs], self.device)
            try:
                codes, embed_sum = self.cp_graphs(past, code0, sample=not greedy)
            except Exception:  # capture failed: eager from now on, and say so once
                logger.exception("code predictor CUDA graph failed; using eager PyTorch")
                self.cp_graphs = None
            else:
                if frames_later:
                    frames = codes.to(torch.long).to("cpu", non_blocking=True)  # pinned
                    self._frames_copy = torch.cuda.Event()
                    self._frames_copy.record()
                else:
                    frames = codes.to("cpu", torch.long)
                return {s.request_id: (frames[i:i + 1], embed_sum[i:i + 1])
                        for i, s in enumerate(seqs)}
        cp = self.model.code_predictor
        last = (code0.view(-1, 1) if code0 is not None else
                torch.tensor([[s.codec_ids[-1]] for s in seqs], device=self.device))
        last_embed = self.model.get_input_embeddings()(last)                 # [B, 1, D]
        past = torch.cat([s.past_hidden for s in seqs], dim=0)               # [B, 1, D]
        out = cp(inputs_embeds=torch.cat([past, last_embed], dim=1),
                 cache=DynamicCache(config=cp.config), use_cache=True)
        codes = [last[:, 0]]
        embed_sum = last_embed
        params = [code_predictor_params(s.params) for s in seqs]
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

    def frames_copied(self) -> None:
        """Wait for the last ``residual_codes_batch(frames_later=True)``'s host copy."""
        event = self.take_frames_copy()
        if event is not None:
            event.synchronize()

    def take_frames_copy(self):
        """The last ``residual_codes_batch(frames_later=True)``'s pending host copy (a CUDA
        event to wait for before reading its frames; None when there is none), now the
        caller's: ``frames_copied()`` no longer waits for it."""
        event, self._frames_copy = self._frames_copy, None
        return event

    def suppressed(self, params: SamplingParams) -> torch.Tensor:
        """The codebook-0 ids a request never samples: the non-codec ids, and the codec end
        too with ``ignore_eos`` (its audio then runs to ``max_audio_frames``)."""
        return self._suppress_eos if params.ignore_eos else self.suppress

    def finish_reason(self, seq: TalkerSeq) -> FinishReason:
        if seq.codec_ids and seq.codec_ids[-1] == self.codec_eos:
            return FinishReason.STOP
        if seq.gen_step >= seq.max_frames:
            return FinishReason.LENGTH
        return FinishReason.NONE


class TalkerRequests:
    """The request table both talker runners keep (``self._seqs``, ``self.inputs``, ``self.cfg``
    are set by the runner): add, deliver text, query. Aborting and stepping are the backend's."""

    _seqs: dict[str, TalkerSeq]
    inputs: TalkerInputs

    def check_request(self, speaker: str, max_frames: int) -> None:
        """Raise ValueError for what ``add_request`` would refuse of these arguments; adds
        nothing and touches no request state, so it may run beside the step thread."""
        self.inputs.speaker_id(speaker, max_frames)

    def add_request(self, request_id: str, speaker: str, params: SamplingParams,
                    max_frames: int) -> None:
        if request_id in self._seqs:
            raise ValueError(f"duplicate request_id {request_id!r}")
        self._seqs[request_id] = self.inputs.new_seq(request_id, speaker, params, max_frames,
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
        seq.deliver(token_ids, finished, prompt_token_ids, mm_hidden, image_grid_thw,
                    audio_feature_lengths, self.cfg)

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    def has_ready(self) -> bool:
        return any(s.ready() for s in self._seqs.values())

    @property
    def num_requests(self) -> int:
        return len(self._seqs)

    def request_ids(self) -> list[str]:
        return list(self._seqs)


def assistant_start(ids: list[int], cfg) -> int:
    """Index of the last ``<|im_start|>assistant`` in the prompt."""
    for i in range(len(ids) - 2, -1, -1):
        if ids[i] == cfg.im_start_token_id and ids[i + 1] == cfg.assistant_token_id:
            return i
    raise ValueError("prompt must end with an '<|im_start|>assistant' turn")


def user_positions(ids: list[int], cfg) -> list[int]:
    """Positions inside user turns (the role token after the last <|im_start|> is 'user')."""
    out, role = [], None
    for i, t in enumerate(ids):
        if t == cfg.im_start_token_id:
            role = ids[i + 1] if i + 1 < len(ids) else None
        if role == cfg.user_token_id:
            out.append(i)
    return out
