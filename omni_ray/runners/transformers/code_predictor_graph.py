"""The talker's code predictor as one CUDA graph per batch size.

Per frame the code predictor runs 15 tiny sequential steps (one 2-token prefill, then one token
per codebook) of a 5-layer decoder: about 75 small forwards, each dozens of kernel launches. In
eager PyTorch that is launch-bound (measured on an H200 at real size: ~70 ms per frame whatever
the batch). Here the whole 15-step loop (embeddings, decoder layers, heads, argmax) is written
with static shapes over a preallocated KV buffer, so it can be captured once per batch-size bucket
and replayed with one launch.

``static_codes`` is the same computation in plain PyTorch (used for the capture, and on CPU by
the tests that check it against transformers' code predictor). With ``sample=True`` each code is
drawn the way transformers' ``generate`` draws the code predictor's (temperature 1, top-k 50,
top-p 0.8; among the top ``CANDIDATES`` codes, not the whole codebook) from the device's
default generator (graph-safe); requests with a seed keep the eager path and their own
generator, so seeded sampling stays reproducible.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from omni_ray.runners.transformers.code_predictor_sampling import CP_TOP_K, CP_TOP_P

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


# The sampled codes are drawn among this many candidates per row, not the whole codebook (2048
# at real size): the top-k rule keeps the top ``CP_TOP_K`` (50) and any tied with the 50th, so
# a margin of 14 ties; one small top-k replaces a sort of the codebook, its softmaxes and draws
# (per frame, 15 of each).
CANDIDATES = 64


def candidates(logits: torch.Tensor, top_k: int = CP_TOP_K, top_p: float = CP_TOP_P,
               width: int = CANDIDATES) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, V] logits -> the top ``width`` (ascending) with those outside top-k, then outside
    top-p, set to -inf (the rule of ``runners.sampling.sample_token``), and their ids; static
    shapes. Ties with the k-th beyond ``width`` are the only difference from the full rule."""
    width = min(width, logits.shape[-1])
    top, ids = torch.topk(logits, width, dim=-1)                      # descending
    top, ids = top.flip(-1), ids.flip(-1)                             # ascending, as the rule
    kth = top[:, width - min(top_k, width):][:, :1]
    top = top.masked_fill(top < kth, float("-inf"))
    remove = top.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[:, -1] = False
    return top.masked_fill(remove, float("-inf")), ids


def top_k_top_p(logits: torch.Tensor, top_k: int = CP_TOP_K,
                top_p: float = CP_TOP_P) -> torch.Tensor:
    """[B, V] logits with everything outside top-k, then outside top-p, set to -inf
    (``candidates`` scattered back over the codebook)."""
    top, ids = candidates(logits, top_k, top_p)
    return torch.full_like(logits, float("-inf")).scatter(-1, ids, top)


def _pick(logits: torch.Tensor, sample: bool, width: int = CANDIDATES,
          noise: torch.Tensor | None = None) -> torch.Tensor:
    """[B, V] logits -> codes [B]: greedy, or drawn among ``candidates``. ``noise``: the draw's
    Exp(1) variates [B, width] (drawn here when None)."""
    if not sample:
        return logits.argmax(-1)
    top, ids = candidates(logits.float(), width=width)
    probs = top.softmax(-1)
    if noise is None:
        noise = torch.empty_like(probs).exponential_()
    # Exponential race: argmax(p / E), E ~ Exp(1), is a draw from p (no host sync, graph-safe).
    won = (probs / noise).argmax(-1, keepdim=True)
    return ids.gather(-1, won).squeeze(-1)


def head_step(head_weight: torch.Tensor, embed_weight: torch.Tensor, h: torch.Tensor,
              sample: bool, width: int, noise: torch.Tensor | None):
    """One codebook step's end: its head over the last position ``h`` [B, D], the pick, and the
    picked code's embedding -> (codes [B], embedding [B, 1, D]). A function of tensors only, so
    ``CodePredictorGraphs`` compiles it once for all 15 steps: eager, the head, the candidates'
    filter and the draw are ~18 kernels a step, more than the decoder's share of the step."""
    code = _pick(F.linear(h, head_weight), sample, width, noise)
    return code, F.embedding(code, embed_weight).unsqueeze(1)


class FusedLayer(torch.nn.Module):
    """A code predictor decoder layer whose q/k/v projections are one GEMM and gate/up one
    (``fused_layers``): per frame 15 steps x 5 layers of GEMMs only a few rows tall, each launch
    costs more than its math, and this makes 4 launches a layer of 7. The layer's norms,
    attention and MLP modules are shared, not copied; only the two concatenated weights are new."""

    def __init__(self, layer):
        super().__init__()
        a, m = self.self_attn, self.mlp = layer.self_attn, layer.mlp
        if m.gate_proj.bias is not None:
            raise ValueError("code predictor MLP with a bias: not fused")
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = layer.post_attention_layernorm
        projs = (a.q_proj, a.k_proj, a.v_proj)
        self.qkv_sizes = tuple(p.out_features for p in projs)
        with torch.no_grad():
            self.register_buffer("qkv_weight", torch.cat([p.weight for p in projs]), False)
            self.register_buffer("qkv_bias", None if a.q_proj.bias is None else
                                 torch.cat([p.bias for p in projs]), False)
            self.register_buffer("gate_up_weight",
                                 torch.cat([m.gate_proj.weight, m.up_proj.weight]), False)


def fused_layers(talker) -> tuple[FusedLayer, ...]:
    model = talker.code_predictor.model
    return tuple(FusedLayer(layer) for layer in model.layers[:model.config.num_hidden_layers])


def _qkv(layer, h: torch.Tensor):
    if isinstance(layer, FusedLayer):
        return F.linear(h, layer.qkv_weight, layer.qkv_bias).split(layer.qkv_sizes, dim=-1)
    attn = layer.self_attn
    return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)


def _mlp(layer, h: torch.Tensor) -> torch.Tensor:
    mlp = layer.mlp
    if isinstance(layer, FusedLayer):
        gate, up = F.linear(h, layer.gate_up_weight).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)
    return mlp(h)


def rope_steps(talker, like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The rotary (cos, sin) of each of ``static_codes``' steps (positions 0-1, then 2, 3, ...),
    each computed as the step computes it. They are the same every frame: a CUDA graph takes
    them as inputs (``CodePredictorGraphs``) instead of running ~10 small kernels a step for
    them, 15 steps a frame. ``like``: a tensor of the dtype and device they are for."""
    model = talker.code_predictor.model
    groups = len(talker.code_predictor.lm_head) + 1
    out = []
    for start, length in [(0, 2)] + [(p, 1) for p in range(2, groups)]:
        pos = torch.arange(start, start + length, device=like.device).unsqueeze(0)
        out.append(model.rotary_emb(like, pos))
    return out


def static_codes(talker, past_hidden: torch.Tensor, code0: torch.Tensor,
                 kv: list[tuple[torch.Tensor, torch.Tensor]], sample: bool = False,
                 decoder=None, layers=None, sample_width: int = CANDIDATES, rope=None,
                 head=None):
    """codes [B, G] (codebook 0 = ``code0``, 1..G-1 greedy, or sampled if ``sample``) and the
    summed embedding [B, 1, D] of the G codes, from ``past_hidden`` [B, 1, D] and ``code0`` [B].
    ``kv``: per layer (keys, values) buffers [B, kv_heads, G, head_dim], overwritten.
    ``decoder``: ``decoder_layers`` or a compiled copy of it (``CompiledDecoder``); ``layers``:
    the decoder layers it runs (default transformers' own; ``fused_layers`` for fewer GEMMs);
    ``sample_width``: sampled codes are drawn among this many candidates (``candidates``);
    ``rope``: ``rope_steps``' tables (default: computed here, step by step); ``head``:
    ``head_step`` or a compiled copy of it."""
    cp = talker.code_predictor
    model = cp.model
    decoder = decoder or decoder_layers
    head = head or head_step
    layers = layers or tuple(model.layers[:model.config.num_hidden_layers])
    groups = len(cp.lm_head) + 1
    e0 = talker.get_input_embeddings()(code0).unsqueeze(1)            # [B, 1, D]
    x = torch.cat([past_hidden, e0], dim=1)                           # [B, 2, D]
    rope = rope or rope_steps(talker, x)
    width = min(sample_width, cp.lm_head[0].out_features)
    embed_sum = e0
    codes = [code0]
    start = 0
    for step in range(1, groups):
        length = x.shape[1]
        cos, sin = rope[step - 1]
        h = decoder(layers, model.norm, x, cos, sin, kv, start, step == 1)
        # the draw's variates outside ``head`` (a compiled head's RNG would be fixed at the
        # graph's capture); every input fresh and contiguous: one compile serves all steps
        noise = (torch.empty((x.shape[0], width), device=x.device,
                             dtype=torch.float32).exponential_() if sample else None)
        code, emb = head(cp.lm_head[step - 1].weight, model.get_input_embeddings()[step - 1].weight,
                         h[:, -1].contiguous(), sample, width, noise)
        codes.append(code)
        embed_sum = embed_sum + emb
        start += length
        x = emb
    return torch.stack(codes, dim=1), embed_sum


def decoder_layers(layers, norm, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   kv: list[tuple[torch.Tensor, torch.Tensor]], start: int,
                   causal: bool) -> torch.Tensor:
    """The code predictor's decoder layers and final norm over ``h`` [B, L, D] at positions
    ``start..start+L-1``, writing each layer's keys and values into ``kv`` there; ``causal``:
    the 2-token first step (one token attends to all before it, so no mask)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

    length = h.shape[1]
    for layer, (keys, values) in zip(layers, kv):
        attn = layer.self_attn
        r = h
        h = layer.input_layernorm(h)
        shape = (h.shape[0], length, -1, attn.head_dim)
        q, k, v = _qkv(layer, h)
        q = attn.q_norm(q.reshape(shape)).transpose(1, 2)
        k = attn.k_norm(k.reshape(shape)).transpose(1, 2)
        v = v.reshape(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys[:, :, start:start + length] = k
        values[:, :, start:start + length] = v
        o = F.scaled_dot_product_attention(
            q, keys[:, :, :start + length], values[:, :, :start + length],
            is_causal=causal, scale=attn.scaling, enable_gqa=True)
        h = r + attn.o_proj(o.transpose(1, 2).reshape(h.shape[0], length, -1))
        h = h + _mlp(layer, layer.post_attention_layernorm(h))
    return norm(h)


class CodePredictorGraphs:
    """``static_codes`` captured as a CUDA graph per (batch bucket, greedy or sampled); ``warm_up``
    captures them ahead of traffic (a capture costs ~0.1-1 s).

    With ``fuse`` (``StageConfig.fused_code_predictor``), the layers run ``FusedLayer``'s GEMMs.
    With ``compile``, the decoder layers inside the graph are ``torch.compile``'d first (one
    dynamic-shape compile serves every bucket): a graph of 15 steps x 5 layers of tiny eager
    ops is ~4,500 kernels, latency-bound even replayed; fused, it is a fraction of that. Each
    step's ``head_step`` (head, filter, draw, embedding) is compiled the same way. Should the
    compile or its capture fail, the graphs fall back to the eager decoder and head (logged)."""

    def __init__(self, talker, device: str, dtype: torch.dtype, compile: bool = False,
                 fuse: bool = False, sample_width: int = CANDIDATES, compile_head: bool = True):
        cfg = talker.code_predictor.model.config
        self.talker = talker
        self.device = device
        self.dtype = dtype
        self.groups = len(talker.code_predictor.lm_head) + 1
        self.hidden = cfg.hidden_size
        self.kv_shape = (cfg.num_key_value_heads, self.groups,
                         getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        self.layers = cfg.num_hidden_layers
        self._graphs: dict[int, tuple] = {}
        self._pool = None
        self.fused = fused_layers(talker) if fuse else None  # None: transformers' own layers
        self.sample_width = sample_width  # a sampled code's candidates (codebook size: all)
        self.decoder = (torch.compile(decoder_layers, dynamic=True, fullgraph=True) if compile
                        else decoder_layers)
        # each step's head, filter, draw and embedding compiled too (fewer kernels a step);
        # ``compile_head=False`` keeps them eager (benchmarks/code_predictor_bench.py's A/B)
        self.head = (torch.compile(head_step, dynamic=True, fullgraph=True)
                     if compile and compile_head else head_step)
        # the steps' rotary tables, outside every graph (the same for all buckets and frames)
        with torch.inference_mode():
            self.rope = rope_steps(talker, torch.empty(0, device=device, dtype=dtype))
        # where the captures' time went (start_phases): the runs before each capture (the
        # decoder's compile happens in the first ones), and the captures themselves
        self.timing = dict(runs_s=0.0, captures_s=0.0, graphs=0)

    def warm_up(self, max_batch: int, sample: bool = False) -> None:
        for b in BUCKETS:
            if b > max_batch and b != BUCKETS[0]:
                break
            if (b, sample) not in self._graphs:
                self._capture(b, sample)

    def __call__(self, past_hidden: torch.Tensor, code0: torch.Tensor, sample: bool = False):
        n = past_hidden.shape[0]
        bucket = next((b for b in BUCKETS if b >= n), None)
        if bucket is None:  # bigger than the largest bucket: in pieces
            parts = [self(past_hidden[i:i + BUCKETS[-1]], code0[i:i + BUCKETS[-1]], sample)
                     for i in range(0, n, BUCKETS[-1])]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        entry = self._graphs.get((bucket, sample)) or self._capture(bucket, sample)
        graph, hid, c0, codes, embed_sum = entry[:5]
        hid[:n].copy_(past_hidden)
        c0[:n].copy_(code0)
        graph.replay()
        return codes[:n].clone(), embed_sum[:n].clone()

    def _capture(self, bucket: int, sample: bool = False):
        while True:
            try:
                return self._capture_with(bucket, sample)
            except Exception as e:  # noqa: BLE001 - a compiler failure costs speed, not the stage
                if self.head is not head_step:  # the newer compile goes first
                    what, self.head = "head", head_step
                elif self.decoder is not decoder_layers:
                    what, self.decoder = "decoder", decoder_layers
                else:
                    raise
                import logging

                logging.getLogger(__name__).warning(
                    "code predictor: compiled %s failed (%s: %s); eager kernels for it in the "
                    "graphs", what, type(e).__name__, e)
                torch.cuda.synchronize()

    @torch.inference_mode()
    def _capture_with(self, bucket: int, sample: bool):
        hid = torch.zeros((bucket, 1, self.hidden), device=self.device, dtype=self.dtype)
        c0 = torch.zeros((bucket,), device=self.device, dtype=torch.long)
        kv = [(torch.zeros((bucket, *self.kv_shape), device=self.device, dtype=self.dtype),
               torch.zeros((bucket, *self.kv_shape), device=self.device, dtype=self.dtype))
              for _ in range(self.layers)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up (allocations, lazy inits, compiles) outside the graph
                static_codes(self.talker, hid, c0, kv, sample, self.decoder, self.fused,
                             self.sample_width, self.rope, self.head)
        stream.synchronize()  # at start only: the runs' GPU time counted with them
        t1 = time.perf_counter()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            codes, embed_sum = static_codes(self.talker, hid, c0, kv, sample, self.decoder,
                                            self.fused, self.sample_width, self.rope, self.head)
        self._pool = graph.pool()
        self.timing["runs_s"] += t1 - t0
        self.timing["captures_s"] += time.perf_counter() - t1
        self.timing["graphs"] += 1
        entry = (graph, hid, c0, codes, embed_sum, kv)  # kv: kept alive with the graph
        self._graphs[(bucket, sample)] = entry
        return entry
