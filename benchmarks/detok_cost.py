"""Ingress detokenization cost per token (issue 20 item 5): a 4096-token answer streamed one token
at a time through ``omni_ray.ingress.detok.Detokenizer`` against re-decoding the whole answer per
token (the ingress before). Prints JSON: seconds for each, and the per-token cost of the last 512
tokens over the first 512 (1.0 = independent of the answer's length).

    python -m benchmarks.detok_cost [--model DIR] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import random
import time


def full_redecode(tok, ids):
    sent, t = "", []
    for i in range(1, len(ids) + 1):
        t0 = time.perf_counter()
        text = tok.decode(ids[:i], skip_special_tokens=True)
        sent = text if not text.endswith("\ufffd") else sent
        t.append(time.perf_counter() - t0)
    return t


def incremental(tok, ids):
    from omni_ray.ingress.detok import Detokenizer

    d, t = Detokenizer(tok), []
    for i, x in enumerate(ids):
        t0 = time.perf_counter()
        d.add([x], final=i == len(ids) - 1)
        t.append(time.perf_counter() - t0)
    assert d.text == tok.decode(ids, skip_special_tokens=True)
    return t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the tiny one)")
    ap.add_argument("--tokens", type=int, default=4096)
    a = ap.parse_args(argv)
    from omni_ray.config.serving import OmniServingArgs
    from omni_ray.models.tokenizer import load_tokenizer

    tok = load_tokenizer(a.model or OmniServingArgs(make_tiny_if_missing=True).checkpoint_dir())
    text = " ".join(random.Random(0).choice(["the", "quick", "日本語", "ñandú", "🎉", "omni,"])
                    for _ in range(a.tokens))
    ids = tok.encode(text, add_special_tokens=False)[: a.tokens]
    out = {}
    for name, fn in (("full_redecode", full_redecode), ("incremental", incremental)):
        t = fn(tok, ids)
        out[name] = dict(total_s=round(sum(t), 4),
                         last_over_first_512=round(sum(t[-512:]) / sum(t[:512]), 2))
    out["tokens"] = len(ids)
    out["speedup"] = round(out["full_redecode"]["total_s"] / out["incremental"]["total_s"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
