"""Move a request's KV out of, and back into, a transformers ``DynamicCache`` (Ray-free).

The wire layout is one tensor per request, ``[layers, 2 (key, value), kv_heads, tokens,
head_dim]`` (batch 1 squeezed away), so the payload does not depend on transformers' cache classes
and a decode replica can rebuild the cache with any dtype/device it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Prefilled:
    """What ``ThinkerRunner.prefill_only`` leaves behind for one request."""

    first_token: int
    cache: object                       # transformers DynamicCache over the prompt's tokens
    num_tokens: int                     # prompt tokens in the cache
    rng_state: torch.Tensor | None      # [n] uint8 sampler generator state after the first draw
    rope_delta: int = 0


def extract_prompt_kv(cache, num_tokens: int) -> torch.Tensor:
    """A CPU copy of the first ``num_tokens`` positions of every layer.

    Returns ``[layers, 2, kv_heads, num_tokens, head_dim]`` in the cache's dtype. The copy is
    synchronous (``.cpu()``), so once this returns the cache may be freed: no asynchronous copy
    can still be reading it.
    """
    layers = []
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "is_sliding", False):
            raise NotImplementedError(f"layer {i}: sliding-window caches are not transferable")
        keys, values = layer.keys, layer.values
        if keys is None or keys.dim() != 4 or keys.shape[0] != 1:
            raise ValueError(f"layer {i}: expected a [1, heads, tokens, dim] cache, got "
                             f"{None if keys is None else tuple(keys.shape)}")
        if keys.shape[-2] < num_tokens:
            raise ValueError(f"layer {i}: cache holds {keys.shape[-2]} tokens, "
                             f"need {num_tokens}")
        layers.append(torch.stack([keys[0, :, :num_tokens], values[0, :, :num_tokens]]))
    if not layers:
        raise ValueError("empty cache: nothing to extract")
    return torch.stack(layers).cpu().contiguous()


def cache_from_kv(kv: torch.Tensor, text_config, device="cpu", dtype: torch.dtype | None = None):
    """A fresh ``DynamicCache`` holding ``kv`` ([layers, 2, kv_heads, tokens, head_dim]).

    The tensors are copied onto ``device`` (and ``dtype``, default: kv's), so the cache owns its
    memory and ``kv`` can be freed as soon as this returns.
    """
    from transformers import DynamicCache

    if kv.dim() != 5 or kv.shape[1] != 2:
        raise ValueError(f"expected [layers, 2, heads, tokens, dim], got {tuple(kv.shape)}")
    n_layers = getattr(text_config, "num_hidden_layers", kv.shape[0])
    if kv.shape[0] != n_layers:
        raise ValueError(f"KV has {kv.shape[0]} layers, the model has {n_layers}")
    kv = kv.to(device=device, dtype=dtype or kv.dtype)
    cache = DynamicCache(config=text_config)
    for i in range(kv.shape[0]):
        cache.layers[i].update(kv[i, 0].unsqueeze(0), kv[i, 1].unsqueeze(0))  # concatenates: a copy
    return cache


def kv_bytes_per_token(text_config, dtype: torch.dtype) -> int:
    """Bytes one prompt token adds to the transferred KV (2 x layers x kv_heads x head_dim)."""
    head_dim = getattr(text_config, "head_dim", None) or (
        text_config.hidden_size // text_config.num_attention_heads)
    return (2 * text_config.num_hidden_layers * text_config.num_key_value_heads * head_dim
            * torch.empty(0, dtype=dtype).element_size())
