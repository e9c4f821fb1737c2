"""Capture the thinker's accept-layer hidden states at the multimodal prompt positions in vLLM.

The model (``omni_ray.models.vllm_thinker``) copies decoder layer ``accept_hidden_layer``'s output
rows of every forward into a buffer, compiled and CUDA-graphed or not; this reads the rows of the
registered requests' multimodal positions out of it right after the forward, in a wrapper on the
model's ``compute_logits`` (which vLLM calls eagerly, once per step, after the forward). It relies
on these vLLM 0.26 internals (checked here; the parity tests in tests/vllm fail if they move):

* the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its worker is
  ``engine.model_executor.driver_worker.worker`` with a ``model_runner``;
* during a step, ``model_runner.input_batch.req_ids[:num_reqs]`` lists the batch's requests in
  row order (vLLM's internal ids: ours plus ``-`` and a random suffix), ``model_runner.
  query_start_loc.np`` their row ranges, and ``input_batch.num_computed_tokens_cpu`` the prompt
  position of each request's first row.
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

    def __init__(self, engine):
        try:
            runner = engine.model_executor.driver_worker.worker.model_runner
            model = runner.get_model()
            runner.input_batch, runner.query_start_loc  # noqa: B018 - fail now if they moved
        except AttributeError as e:
            raise RuntimeError("vLLM internals the multimodal hidden-state capture relies on "
                               f"have moved ({e}); see omni_ray/runners/vllm/hidden.py") from e
        if getattr(model, "omni_rows", lambda: None)() is None:
            raise RuntimeError("the vLLM thinker was not built with omni_ray's capture layer "
                               "(hf_overrides architectures / omni_ray_capture_layer)")
        self._runner = runner
        self._model = model
        self._want: dict[str, _Want] = {}
        self._compute_logits = model.compute_logits
        model.compute_logits = self._after_forward

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
        self._model.compute_logits = self._compute_logits
        self._want.clear()

    def _after_forward(self, hidden_states):
        if self._want:
            self._collect(self._model.omni_rows())
        return self._compute_logits(hidden_states)

    def _collect(self, layer_out: torch.Tensor) -> None:
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
