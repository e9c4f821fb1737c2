"""Capture the thinker's accept-layer hidden states at the multimodal prompt positions in vLLM.

The talker conditions on the thinker's hidden states after decoder layer ``accept_hidden_layer``
at the audio / image positions of the prompt (transformers' ``hidden_states[accept_hidden_layer]``:
the layer's output, before any deepstack addition). vLLM has no API for intermediate hidden
states, so this is a forward hook on that decoder layer, reading the batch layout from the
model runner. It relies on these vLLM 0.26 internals (checked at install; the parity tests in
tests/vllm fail if they move):

* the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its worker is
  ``engine.model_executor.driver_worker.worker`` with a ``model_runner``;
* the Qwen3-Omni thinker's decoder layers are ``model.language_model.model.layers`` and each
  returns ``(hidden_states, residual)`` with the layer output equal to their sum;
* during a forward, ``model_runner.input_batch.req_ids[:num_reqs]`` lists the batch's requests in
  row order (vLLM's internal ids: ours plus ``-`` and a random suffix), ``model_runner.
  query_start_loc.np`` their row ranges, and ``input_batch.num_computed_tokens_cpu`` the prompt
  position of each request's first row.

The hook runs in Python on every forward, so the model must run eagerly (no CUDA graphs /
torch.compile of the decoder layers): true on CPU with ``enforce_eager``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class _Want:
    positions: list[int]  # multimodal prompt positions, ascending
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> [hidden] (CPU)


class MMHiddenCapture:
    """Collects, per registered request, the accept-layer rows at its multimodal positions."""

    def __init__(self, engine, accept_hidden_layer: int):
        if accept_hidden_layer < 1:
            raise ValueError("accept_hidden_layer must be >= 1 (a decoder layer's output)")
        try:
            runner = engine.model_executor.driver_worker.worker.model_runner
            layers = runner.get_model().language_model.model.layers
            runner.input_batch, runner.query_start_loc  # noqa: B018 - fail now if they moved
        except AttributeError as e:
            raise RuntimeError("vLLM internals the multimodal hidden-state hook relies on "
                               f"have moved ({e}); see omni_ray/runners/vllm_hidden.py") from e
        self._runner = runner
        self._want: dict[str, _Want] = {}
        self._handle = layers[accept_hidden_layer - 1].register_forward_hook(self._hook)

    def register(self, request_id: str, mm_positions: list[int]) -> None:
        self._want[request_id] = _Want(sorted(mm_positions))

    def forget(self, request_id: str) -> None:
        self._want.pop(request_id, None)

    def take(self, request_id: str) -> torch.Tensor:
        """[n_mm, hidden] rows in position order; raises if the prefill did not cover them."""
        want = self._want.pop(request_id)
        missing = [p for p in want.positions if p not in want.rows]
        if missing:
            raise RuntimeError(f"{request_id}: no hidden state for {len(missing)} multimodal "
                               f"positions (first {missing[0]}); was the prefill cached?")
        return torch.stack([want.rows[p] for p in want.positions])

    def close(self) -> None:
        self._handle.remove()
        self._want.clear()

    def _hook(self, module, inputs, output) -> None:
        if not self._want:
            return
        hidden, residual = output
        layer_out = hidden if residual is None else hidden + residual
        batch = self._runner.input_batch
        starts = self._runner.query_start_loc.np
        for i, internal in enumerate(batch.req_ids[:batch.num_reqs]):
            want = self._want.get(internal) or self._want.get(internal.rpartition("-")[0])
            if want is None:
                continue
            first, row0, row1 = int(batch.num_computed_tokens_cpu[i]), int(starts[i]), \
                int(starts[i + 1])
            for p in want.positions:
                if first <= p < first + (row1 - row0):
                    want.rows[p] = layer_out[row0 + p - first].detach().to("cpu", copy=True)
