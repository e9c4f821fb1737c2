"""A vLLM KV connector for omni_ray's prefill/decode hand-off (vLLM 0.26's KV-connector API).

The ingress owns the KV lifecycle (omni_ray/kv_lifecycle.py) and moves each request's prompt KV
through the Ray object store as a ``KVChunk`` in the portable layout ``[layers, 2, kv_heads,
tokens, head_dim]`` (the transformers runner's too). This connector is the vLLM end of it, in
the engine's own process:

* a request added with ``kv_transfer_params={"omni_ray": "save", "key": K}`` has its prompt's KV
  read out of vLLM's paged cache once its prefill has run, into ``SAVED[K]``;
* a request added with ``{"omni_ray": "load", "key": K, "num_tokens": T}`` gets the first ``T``
  positions from ``TO_LOAD[K]`` written into its blocks before its first forward (vLLM then
  computes only the rest of the prompt).

The caller (``VllmThinkerRunner``) fills ``TO_LOAD`` and empties ``SAVED``; the object store is
the caller's business. Loading and saving are synchronous, in the model runner's thread.

Paged layouts read and written here (checked against transformers' cache by tests/vllm):
``cpu_attn`` ``[blocks, kv_heads, block_size, 2 * head_dim]``, where each block holds the keys
transposed ``[head_dim, block_size]`` then the values ``[block_size, head_dim]``; the
FlashAttention layout ``[2, blocks, block_size, kv_heads, head_dim]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

SAVED: dict[str, torch.Tensor] = {}    # key -> [layers, 2, heads, tokens, dim] (CPU)
TO_LOAD: dict[str, torch.Tensor] = {}  # key -> the same, staged by the runner before add_request
CONFIG = {"kv_connector": "OmniRayKVConnector", "kv_role": "kv_both",
          "kv_connector_module_path": __name__}
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass
class _Op:
    key: str
    block_ids: list[int]
    start: int  # first position to load (positions before it are in vLLM's prefix cache)
    num_tokens: int


@dataclass
class OmniRayConnectorMetadata(KVConnectorMetadata):
    loads: list[_Op] = field(default_factory=list)
    saves: list[_Op] = field(default_factory=list)


class OmniRayKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        self._head_dim = vllm_config.model_config.get_head_size()
        # scheduler side
        self._params: dict[str, dict] = {}      # vLLM request id -> our kv_transfer_params
        self._to_load: dict[str, int] = {}      # request id -> positions to load (allocated)
        self._saving: dict[str, tuple[list[int], int]] = {}  # request id -> (blocks, prompt len)
        # worker side
        self._caches: dict[int, torch.Tensor] = {}  # decoder layer index -> paged KV

    # -- scheduler side --------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        params = request.kv_transfer_params or {}
        if params.get("omni_ray") not in ("save", "load"):
            return 0, False
        self._params[request.request_id] = params
        if params["omni_ray"] != "load" or params["key"] not in TO_LOAD:
            return 0, False
        return max(int(params["num_tokens"]) - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        if num_external_tokens > 0:
            self._to_load[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = OmniRayConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            params = self._params.get(new.req_id)
            if params is None:
                continue
            blocks = list(new.block_ids[0])
            if new.req_id in self._to_load:
                n = self._to_load.pop(new.req_id)
                meta.loads.append(_Op(params["key"], blocks, new.num_computed_tokens - n,
                                      new.num_computed_tokens))
            if params["omni_ray"] == "save":
                self._saving[new.req_id] = (blocks, len(new.prompt_token_ids or ()))
                self._maybe_save(meta, new.req_id, new.num_computed_tokens + scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid not in self._saving:
                continue
            if cached.new_block_ids[i] is not None:
                self._saving[rid][0].extend(cached.new_block_ids[i][0])
            self._maybe_save(meta, rid, cached.num_computed_tokens[i] + scheduled[rid])
        return meta

    def _maybe_save(self, meta: OmniRayConnectorMetadata, rid: str, computed_after: int) -> None:
        blocks, prompt_len = self._saving[rid]
        if computed_after >= prompt_len:  # the prompt's last rows run in this step
            del self._saving[rid]
            meta.saves.append(_Op(self._params[rid]["key"], list(blocks), 0, prompt_len))

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict | None]:
        rid = request.request_id
        self._params.pop(rid, None)
        self._to_load.pop(rid, None)
        self._saving.pop(rid, None)
        return False, None

    # -- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        for name, cache in kv_caches.items():
            m = _LAYER.search(f".{name}.")
            if m is None:
                raise ValueError(f"cannot tell the decoder layer of KV cache {name!r}")
            self._caches[int(m.group(1))] = cache

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        for op in meta.loads:
            kv = TO_LOAD.pop(op.key, None)
            if kv is None:
                raise RuntimeError(f"{op.key}: no staged KV to load")
            if kv.shape[0] != len(self._caches) or kv.shape[3] < op.num_tokens:
                raise ValueError(f"{op.key}: staged KV {tuple(kv.shape)} does not fit "
                                 f"{len(self._caches)} layers x {op.num_tokens} tokens")
            pos = torch.arange(op.start, op.num_tokens)
            for layer, cache in self._caches.items():
                rows = kv[layer, :, :, op.start:op.num_tokens].to(cache.device, cache.dtype)
                _write(cache, op.block_ids, pos, rows, self._block_size, self._head_dim)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata,
                      **kwargs: Any) -> None:
        return None  # saved whole in wait_for_save, once the forward has written every layer

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for op in meta.saves:
            pos = torch.arange(op.num_tokens)
            SAVED[op.key] = torch.stack([
                _read(self._caches[layer], op.block_ids, pos, self._block_size, self._head_dim)
                for layer in sorted(self._caches)]).cpu()


def _slots(block_ids: list[int], pos: torch.Tensor, block_size: int):
    return torch.tensor(block_ids, dtype=torch.long)[pos // block_size], pos % block_size


def _read(cache: torch.Tensor, block_ids, pos, block_size: int, head_dim: int) -> torch.Tensor:
    """[2, heads, len(pos), head_dim] keys and values at prompt positions ``pos``."""
    blk, off = _slots(block_ids, pos, block_size)
    if cache.dim() == 5 and cache.shape[0] == 2:  # FlashAttention: [2, blocks, bs, heads, dim]
        return cache[:, blk, off].permute(0, 2, 1, 3).contiguous()
    keys, values = _cpu_views(cache, block_size, head_dim)
    k = keys[blk, :, :, off]          # [T, heads, dim]
    v = values[blk, :, off, :]        # [T, heads, dim]
    return torch.stack([k, v]).permute(0, 2, 1, 3).contiguous()


def _write(cache: torch.Tensor, block_ids, pos, rows: torch.Tensor, block_size: int,
           head_dim: int) -> None:
    """Write ``rows`` ([2, heads, len(pos), dim]) at prompt positions ``pos``."""
    blk, off = _slots(block_ids, pos, block_size)
    if cache.dim() == 5 and cache.shape[0] == 2:
        cache[:, blk, off] = rows.permute(0, 2, 1, 3)
        return
    keys, values = _cpu_views(cache, block_size, head_dim)
    keys[blk, :, :, off] = rows[0].permute(1, 0, 2)
    values[blk, :, off, :] = rows[1].permute(1, 0, 2)


def _cpu_views(cache: torch.Tensor, block_size: int, head_dim: int):
    """cpu_attn's ``[blocks, heads, bs, 2 * dim]``: keys ``[blocks, heads, dim, bs]`` and values
    ``[blocks, heads, bs, dim]`` (views: writes go to the cache)."""
    nb, heads = cache.shape[0], cache.shape[1]
    if cache.dim() != 4 or cache.shape[2] * cache.shape[3] != 2 * block_size * head_dim:
        raise ValueError(f"unknown paged KV layout {tuple(cache.shape)}")
    halves = cache.view(nb, heads, 2, block_size * head_dim)
    return (halves[:, :, 0].view(nb, heads, head_dim, block_size),
            halves[:, :, 1].view(nb, heads, block_size, head_dim))
