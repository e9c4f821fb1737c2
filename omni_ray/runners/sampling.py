"""Pick the next token from logits, the way transformers' ``generate`` does."""

from __future__ import annotations

import torch

from omni_ray.config.sampling import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A per-request generator so seeded sampling does not depend on batch neighbours."""
    if params.greedy or params.seed is None:
        return None
    return torch.Generator().manual_seed(params.seed)


def stop_ids(params: SamplingParams, eos_ids: frozenset[int],
             stop_token_ids: list[int] | None = None) -> frozenset[int]:
    """The ids that end a request: its ``stop_token_ids``, and the model's end ids ``eos_ids``
    unless ``params.ignore_eos``."""
    return (frozenset() if params.ignore_eos else eos_ids) | frozenset(stop_token_ids or ())


def sample_token(
    logits: torch.Tensor,
    params: SamplingParams,
    previous: list[int] | None = None,
    suppress: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Next token id from ``logits`` [vocab] (any float dtype; computed in float32).

    ``previous`` are the ids the repetition penalty applies to; ``suppress`` ids never come out.
    """
    scores = logits.detach().float().cpu().clone()
    # 1) Repetition penalty over previously generated ids (transformers' rule).
    if params.repetition_penalty != 1.0 and previous:
        ids = torch.tensor(sorted(set(previous)), dtype=torch.long)
        picked = scores[ids]
        scores[ids] = torch.where(
            picked < 0, picked * params.repetition_penalty, picked / params.repetition_penalty
        )
    # 2) Suppressed ids.
    if suppress is not None and suppress.numel():
        scores[suppress] = float("-inf")
    if params.greedy:
        return int(torch.argmax(scores))
    # 3) Temperature, top-k, top-p, then a draw.
    scores = scores / params.temperature
    if params.top_k and params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores[scores < kth] = float("-inf")
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove = cum <= (1 - params.top_p)
        remove[-1] = False
        scores[order[remove]] = float("-inf")
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))
