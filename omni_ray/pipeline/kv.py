"""Stage logic of a disaggregated thinker: the prefill side and the decode side (Ray-free).

``PrefillLogic`` runs prompts and holds each request's cache until the engine has saved its KV;
``DecodeThinkerLogic`` is the ordinary ``ThinkerLogic`` plus ``add_prefilled``, which starts a
request from a transferred KV. Both run on their engine's loop thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omni_ray.config.request import OmniRequest
from omni_ray.kv_lifecycle import KVExtractError, KVLoadError
from omni_ray.payload import KVChunk
from omni_ray.pipeline.contracts import KVThinkerRunnerProtocol
from omni_ray.pipeline.emit import StageLogic
from omni_ray.pipeline.thinker import ThinkerLogic

if TYPE_CHECKING:
    from omni_ray.runners.kv import Prefilled


@dataclass
class _Held:
    request: OmniRequest
    prefilled: Prefilled  # owns the request's DynamicCache until ``release``


class PrefillLogic(StageLogic):
    """The sender's side: ``prefill`` (-> HELD), ``extract`` (a copy), ``release`` (frees)."""

    stage = "thinker_prefill"

    def __init__(self, runner: KVThinkerRunnerProtocol):
        self.runner = runner
        self._held: dict[str, _Held] = {}

    def prefill(self, req: OmniRequest) -> int:
        """Run the prompt, keep its cache, return the first sampled token."""
        if req.request_id in self._held:
            raise ValueError(f"duplicate request_id {req.request_id!r}")
        pre = self.runner.prefill_only(req.prompt_token_ids, req.thinker_sampling)
        self._held[req.request_id] = _Held(req, pre)
        return pre.first_token

    def extract(self, request_id: str, fail: bool = False) -> KVChunk:
        """A self-contained CPU copy of the prompt's KV; the held cache stays until release."""
        held = self._held.get(request_id)
        if held is None:
            raise KeyError(f"no KV held for {request_id!r}")
        if fail:
            raise KVExtractError("injected extraction failure (x-omni-kv-fault)")
        pre = held.prefilled
        try:
            kv = self.runner.extract_kv(pre)
        except Exception as e:
            raise KVExtractError(f"{type(e).__name__}: {e}") from e
        return KVChunk(request_id=request_id, kv=kv, num_tokens=pre.num_tokens,
                       first_token=pre.first_token, rng_state=pre.rng_state,
                       rope_delta=pre.rope_delta)

    def release(self, request_id: str) -> bool:
        """Free the request's cache (idempotent: False when nothing was held)."""
        return self._held.pop(request_id, None) is not None

    def abort(self, request_id: str) -> None:
        self.release(request_id)

    def num_requests(self) -> int:
        return len(self._held)

    def request_ids(self) -> list[str]:
        return sorted(self._held)


class DecodeThinkerLogic(ThinkerLogic):
    """``ThinkerLogic`` that can also start a request from a transferred KV."""

    runner: KVThinkerRunnerProtocol

    stage = "thinker_decode"

    def add_prefilled(self, req: OmniRequest, has_downstream: bool, chunk: KVChunk,
                      fail: bool = False) -> None:
        """Load ``chunk`` into a fresh cache and register the request as prefilled; its first
        step emits ``chunk.first_token`` exactly as an unsplit thinker's prefill step would.
        Atomic: on any error nothing of the request stays behind."""
        rid = req.request_id
        if chunk.request_id != rid or chunk.num_tokens != len(req.prompt_token_ids):
            raise KVLoadError(f"KV for {chunk.request_id!r} ({chunk.num_tokens} tokens) does not "
                              f"match request {rid!r} ({len(req.prompt_token_ids)} tokens)")
        if fail:
            raise KVLoadError("injected load failure (x-omni-kv-fault)")
        try:  # atomic: on error the runner holds nothing of the request
            self.runner.add_prefilled_kv(rid, req.prompt_token_ids, chunk.first_token, chunk.kv,
                                         req.thinker_sampling, req.max_tokens,
                                         list(req.stop_token_ids), rng_state=chunk.rng_state,
                                         rope_delta=chunk.rope_delta)
        except Exception as e:
            self.runner.abort(rid)
            raise KVLoadError(f"{type(e).__name__}: {e}") from e
        self._track(req, has_downstream)
