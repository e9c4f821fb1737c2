"""Linear layers whose output for one request does not depend on its batch neighbours (CPU).

A CPU GEMM picks its blocking by the number of rows, so ``x @ W`` for a request batched with
others differs in the last bits from the same request alone, and a sampled code can flip. The
code predictor runs the same shapes for every decoding request, so batching them is the big CPU
win (one forward per codebook for all requests instead of one per request), but the pipeline
promises that a request's answer does not depend on who shares its step.

``RowwiseLinear`` runs a ``[B, L, K]`` input as ``bmm`` against the weight broadcast over the
batch: B GEMMs of L rows, each the one the request would run alone (a ``[1, L, K]`` input goes
through ``F.linear`` as before). With the other ops of the code predictor already per row
(norms, attention over same-length caches), its logits are bitwise those of the request alone
(tests/runners/test_batch_invariant.py). It keeps the module's parameters (no copy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class RowwiseLinear(torch.nn.Linear):
    """``nn.Linear`` that computes each batch entry with its own GEMM."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[0] == 1:
            return F.linear(x, self.weight, self.bias)
        batch, rows, _ = x.shape
        weight = self.weight.t().expand(batch, *self.weight.t().shape)
        if self.bias is None:
            return torch.bmm(x, weight)
        return torch.baddbmm(self.bias.expand(batch, rows, self.out_features), x, weight)


def make_batch_invariant(module: torch.nn.Module) -> int:
    """Turn every plain ``nn.Linear`` under ``module`` into a ``RowwiseLinear`` sharing its
    parameters; returns how many."""
    swapped = 0
    for name, child in list(module.named_modules()):
        if type(child) is not torch.nn.Linear:
            continue
        rowwise = RowwiseLinear(child.in_features, child.out_features, bias=child.bias is not None,
                                device="meta")
        rowwise.weight, rowwise.bias = child.weight, child.bias
        module.set_submodule(name, rowwise)
        swapped += 1
    return swapped
