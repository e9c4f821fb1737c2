"""Where a bfloat16 run may part from float32: the thinker's top-1 minus top-2 logit per token.

gpu_check's tiny phase in bfloat16 (``--tiny-dtype bfloat16``) passes an answer when its first
``BF16_MIN_EQUAL_TEXT_TOKENS`` text tokens equal the offline pipeline's. bf16 keeps 8 bits of
mantissa, so a logit of size m moves by up to ~m * 2**-8 between two bf16 computations; a token
whose top-two margin is below that is a coin flip between them. This prints, for gpu_check's
text and speech-in requests on the tiny checkpoint (float32, CPU, greedy), each answer token's
margin beside that bound: a margin under its bound says where the two bf16 answers may part.

    python -m benchmarks.thinker_margins /path/to/qwen3-omni-tiny [--tokens 8]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

import omni_ray.runners.transformers.thinker as thinker_runner
from benchmarks.answers import PROMPT, QUESTION
from benchmarks.client import spoken_question


def margins(model_dir: str, tokens: int) -> dict[str, list[tuple[float, float]]]:
    """{case: [(top-1 minus top-2 logit, bf16 bound max|logit| * 2**-8) per answer token]}."""
    from omni_ray.config.request import OmniRequest
    from omni_ray.inputs.audio import decode_audio
    from omni_ray.offline import Omni

    seen: list[tuple[float, float]] = []
    sample = thinker_runner.sample_token

    def spy(logits, *args, **kw):
        top = torch.topk(logits.float(), 2).values
        seen.append((float(top[0] - top[1]), float(logits.float().abs().max()) * 2 ** -8))
        return sample(logits, *args, **kw)

    omni = Omni(model_dir, mode="async_chunk", device="cpu", dtype=torch.float32)
    fields = dict(max_tokens=tokens, max_audio_frames=1, speaker="ethan", modalities=("text",))
    out = {}
    try:
        with mock.patch.object(thinker_runner, "sample_token", spy):
            for case in ("text", "speech-in"):
                seen.clear()
                if case == "text":
                    req = OmniRequest(request_id=case, prompt_token_ids=omni.prompt_ids(PROMPT),
                                      **fields)
                else:
                    speech = decode_audio(spoken_question(1.5), "wav", max_seconds=300)
                    req = omni.request([{"role": "user", "content": [
                        {"type": "audio", "audio": speech},
                        {"type": "text", "text": QUESTION}]}], request_id=case, **fields)
                omni.generate(req)
                out[case] = list(seen)
    finally:
        omni.shutdown()
    return out


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
