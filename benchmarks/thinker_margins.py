"""Where a bfloat16 run may part from float32: the thinker's top-1 minus top-2 logit per token.

gpu_check's tiny phase in bfloat16 (``--tiny-dtype bfloat16``) compares the app's text with the
offline pipeline's. bf16 keeps 8 significant bits: near a logit of size m one bf16 step is up to
m * 2**-7, and two bf16 computations of the same logit differ by about that. A token whose
top-two margin is within one such step is a coin flip between them (``BF16_BOUND``). This prints,
for gpu_check's text and speech-in requests on the tiny checkpoint (float32, CPU, greedy), each
answer token's margin beside that bound: a margin under its bound says where two bf16 answers
may part. ``recording_margins`` records the same while any thinker samples (gpu_check's offline
reference does, for the bf16 allowance: benchmarks/answers.py).

    python -m benchmarks.thinker_margins /path/to/qwen3-omni-tiny [--tokens 8]
"""

from __future__ import annotations

import argparse
import contextlib
from unittest import mock

import torch

import omni_ray.runners.transformers.thinker as thinker_runner


BF16_BOUND = 2 ** -7  # one bf16 step near a logit of size 1 (8 significant bits) at most


@contextlib.contextmanager
def recording_margins():
    """While open, every token the (transformers) thinker samples appends (top-1 minus top-2
    logit, its bf16 bound ``max|logit| * BF16_BOUND``) to the yielded list."""
    seen: list[tuple[float, float]] = []
    sample = thinker_runner.sample_token

    def spy(logits, *args, **kw):
        top = torch.topk(logits.float(), 2).values
        seen.append((float(top[0] - top[1]), float(logits.float().abs().max()) * BF16_BOUND))
        return sample(logits, *args, **kw)

    with mock.patch.object(thinker_runner, "sample_token", spy):
        yield seen


def margins(model_dir: str, tokens: int) -> dict[str, list[tuple[float, float]]]:
    """{case: [(top-1 minus top-2 logit, bf16 bound) per answer token]}: gpu_check's text and
    speech-in requests, float32 on CPU."""
    from benchmarks.answers import cases, offline_answers

    todo = {name: {**kw, "audio": False} for name, kw in cases(has_processor=True).items()
            if name in ("text", "speech-in")}  # gpu_check's requests, text out only
    refs = offline_answers(model_dir, "cpu", {"mode": "async_chunk"}, todo, tokens, 1,
                           dtype="float32")
    return {case: ref["margins"] for case, ref in refs.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args(argv)
    out = margins(a.model_dir, a.tokens)
    for case, rows in out.items():
        under = [i for i, (m, bound) in enumerate(rows) if m < bound]
        print(f"{case}: margin / bf16 bound per token: "
              + ", ".join(f"{m:.4f}/{b:.4f}" for m, b in rows)
              + f"; under the bound at tokens {under}")
    return out


if __name__ == "__main__":
    main()
