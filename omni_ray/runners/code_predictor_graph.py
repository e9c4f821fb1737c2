"""The talker's code predictor as one CUDA graph per batch size (greedy decoding).

Per frame the code predictor runs 15 tiny sequential steps (one 2-token prefill, then one token
per codebook) of a 5-layer decoder: about 75 small forwards, each dozens of kernel launches. In
eager PyTorch that is launch-bound (measured on an H200 at real size: ~70 ms per frame whatever
the batch). Here the whole 15-step loop (embeddings, decoder layers, heads, argmax) is written
with static shapes over a preallocated KV buffer, so it can be captured once per batch-size bucket
and replayed with one launch.

``greedy_codes`` is the same computation in plain PyTorch (used for the capture, and on CPU by
the tests that check it against transformers' code predictor). Only greedy decoding: a sampled
request takes transformers' path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def greedy_codes(talker, past_hidden: torch.Tensor, code0: torch.Tensor,
                 kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """codes [B, G] (codebook 0 = ``code0``, 1..G-1 greedy) and the summed embedding [B, 1, D]
    of the G codes, from ``past_hidden`` [B, 1, D] and ``code0`` [B]. ``kv``: per layer
    (keys, values) buffers [B, kv_heads, G, head_dim], overwritten."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

    cp = talker.code_predictor
    model = cp.model
    groups = len(cp.lm_head) + 1
    e0 = talker.get_input_embeddings()(code0).unsqueeze(1)            # [B, 1, D]
    x = torch.cat([past_hidden, e0], dim=1)                           # [B, 2, D]
    embed_sum = e0
    codes = [code0]
    start = 0
    for step in range(1, groups):
        length = x.shape[1]
        pos = torch.arange(start, start + length, device=x.device).unsqueeze(0)
        cos, sin = model.rotary_emb(x, pos)
        h = x
        for i, layer in enumerate(model.layers[:model.config.num_hidden_layers]):
            attn = layer.self_attn
            r = h
            h = layer.input_layernorm(h)
            shape = (h.shape[0], length, -1, attn.head_dim)
            q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = kv[i]
            keys[:, :, start:start + length] = k
            values[:, :, start:start + length] = v
            o = F.scaled_dot_product_attention(
                q, keys[:, :, :start + length], values[:, :, :start + length],
                is_causal=length > 1, scale=attn.scaling, enable_gqa=True)
            h = r + attn.o_proj(o.transpose(1, 2).reshape(h.shape[0], length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = model.norm(h)
        code = cp.lm_head[step - 1](h[:, -1]).argmax(-1)               # [B]
        codes.append(code)
        emb = model.get_input_embeddings()[step - 1](code).unsqueeze(1)
        embed_sum = embed_sum + emb
        start += length
        x = emb
    return torch.stack(codes, dim=1), embed_sum


class CodePredictorGraphs:
    """``greedy_codes`` captured as a CUDA graph per batch bucket, on first use of the bucket."""

    def __init__(self, talker, device: str, dtype: torch.dtype):
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

    def __call__(self, past_hidden: torch.Tensor, code0: torch.Tensor):
        n = past_hidden.shape[0]
        bucket = next((b for b in BUCKETS if b >= n), None)
        if bucket is None:  # bigger than the largest bucket: in pieces
            parts = [self(past_hidden[i:i + BUCKETS[-1]], code0[i:i + BUCKETS[-1]])
                     for i in range(0, n, BUCKETS[-1])]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        entry = self._graphs.get(bucket) or self._capture(bucket)
        graph, hid, c0, codes, embed_sum = entry[:5]
        hid[:n].copy_(past_hidden)
        c0[:n].copy_(code0)
        graph.replay()
        return codes[:n].clone(), embed_sum[:n].clone()

    @torch.inference_mode()
    def _capture(self, bucket: int):
        hid = torch.zeros((bucket, 1, self.hidden), device=self.device, dtype=self.dtype)
        c0 = torch.zeros((bucket,), device=self.device, dtype=torch.long)
        kv = [(torch.zeros((bucket, *self.kv_shape), device=self.device, dtype=self.dtype),
               torch.zeros((bucket, *self.kv_shape), device=self.device, dtype=self.dtype))
              for _ in range(self.layers)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up (allocations, lazy inits) outside the graph
                greedy_codes(self.talker, hid, c0, kv)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            codes, embed_sum = greedy_codes(self.talker, hid, c0, kv)
        self._pool = graph.pool()
        self._graphs[bucket] = (graph, hid, c0, codes, embed_sum, kv)  # kv: kept alive
        return self._graphs[bucket]
