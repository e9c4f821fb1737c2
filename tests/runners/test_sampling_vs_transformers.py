"""``runners/sampling.sample_token`` against transformers' own logits processors on random logits:
repetition penalty, then temperature, top-k and top-p (generate's order). Same scores -> the same
distribution -> with the same seeded generator, the same draw, case after case; greedy is the
argmax of the penalised scores."""

from __future__ import annotations

import pytest
import torch
from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from omni_ray.config.sampling import SamplingParams
from omni_ray.runners.sampling import sample_token

VOCAB = 257
CASES = [dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.05),
         dict(temperature=1.3, top_k=0, top_p=0.5, repetition_penalty=1.0),
         dict(temperature=0.9, top_k=5, top_p=1.0, repetition_penalty=1.5),
         dict(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=0.8)]


def transformers_probs(logits: torch.Tensor, p: SamplingParams, previous: list[int]):
    procs = LogitsProcessorList()
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    procs.append(TemperatureLogitsWarper(p.temperature))
    if p.top_k:
        procs.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        procs.append(TopPLogitsWarper(p.top_p))
    ids = torch.tensor([previous or [0]], dtype=torch.long)
    scores = logits.float().clone()[None]
    if not previous:  # nothing generated yet: no penalty
        procs = LogitsProcessorList([q for q in procs
                                     if not isinstance(q, RepetitionPenaltyLogitsProcessor)])
    return procs(ids, scores)[0].softmax(-1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "t{temperature}-k{top_k}-p{top_p}-r"
                         "{repetition_penalty}".format(**c))
def test_draws_equal_transformers_processors(case):
    params = SamplingParams(**case)
    rng = torch.Generator().manual_seed(7)
    for trial in range(200):
        logits = torch.randn(VOCAB, generator=rng) * 3
        previous = torch.randint(0, VOCAB, (trial % 6,), generator=rng).tolist()
        want = transformers_probs(logits, params, previous)
        got = sample_token(logits, params, previous,
                           generator=torch.Generator().manual_seed(trial))
        ref = int(torch.multinomial(want, 1, generator=torch.Generator().manual_seed(trial)))
        assert got == ref, (trial, got, ref)
        assert want[got] > 0  # never a token the processors removed


def test_greedy_is_the_argmax_after_the_penalty():
    rng = torch.Generator().manual_seed(1)
    params = SamplingParams(repetition_penalty=1.3)
    for _ in range(100):
        logits = torch.randn(VOCAB, generator=rng)
        previous = [int(torch.argmax(logits))]  # the best token was said: penalised
        pen = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([previous]), logits[None].clone())
        assert sample_token(logits, params, previous) == int(torch.argmax(pen[0]))
