"""The talker's code predictor per frame: its CUDA graph with eager kernels vs with the
torch.compile'd decoder (``StageConfig.compile_graphs``), at the released shape.

Builds the released code predictor (5 layers, hidden 1024, random weights) and the talker's codec
embedding, captures ``CodePredictorGraphs`` both ways for each batch size, and times graph
replays (ms per frame for the whole batch: the 15 sequential codebook steps). Greedy codes of
the two are compared (random weights in bfloat16: a rare near-tie may pick differently).
The start cost (compile + capture of the buckets) is reported too. CUDA only.

    .venv/bin/python -m benchmarks.code_predictor_bench --batches 1,8,32
-> ``results/code_predictor_gpu.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.machine import RESULTS_DIR, machine_info, write_json
from omni_ray.models.dummy import RELEASED
from omni_ray.runners.transformers.code_predictor_graph import CodePredictorGraphs, decoder_layers


class _Talker(nn.Module):
    """The two talker parts the graphs use: ``code_predictor`` and the codec embedding."""

    def __init__(self):
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerCodePredictorConfig,
        )
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as CodePredictor,
        )

        super().__init__()
        s = RELEASED
        self.code_predictor = CodePredictor._from_config(
            Qwen3OmniMoeTalkerCodePredictorConfig(**s["code_predictor"]))
        self.codec_embedding = nn.Embedding(s["talker_text"]["vocab_size"],
                                            s["talker_text"]["hidden_size"])

    def get_input_embeddings(self) -> nn.Embedding:
        return self.codec_embedding


def build(device: str, dtype: torch.dtype, seed: int = 0) -> _Talker:
    torch.manual_seed(seed)
    with torch.device(device):
        talker = _Talker().eval()
    with torch.no_grad():
        for p in talker.parameters():
            p.normal_(0, 0.02)
    return talker.to(dtype)


def time_replays(graphs: CodePredictorGraphs, hidden: torch.Tensor, code0: torch.Tensor,
                 iters: int) -> tuple[float, torch.Tensor]:
    codes, _ = graphs(hidden, code0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        graphs(hidden, code0)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3, codes


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    talker = build("cuda", dtype)
    batches = [int(b) for b in a.batches.split(",")]
    hidden_size = talker.codec_embedding.embedding_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    res: dict = dict(machine=machine_info(), shape="qwen3-omni-30b-a3b", dtype=a.dtype,
                     iters=a.iters,
                     modes={})
    codes = {}
    for mode, compile_ in (("eager_graph", False), ("compiled_graph", True)):
        graphs = CodePredictorGraphs(talker, "cuda", dtype, compile=compile_)
        t = time.perf_counter()
        with torch.inference_mode():
            graphs.warm_up(max(batches))
        torch.cuda.synchronize()
        m = dict(start_s=round(time.perf_counter() - t, 1),
                 compiled=graphs.decoder is not decoder_layers, ms_per_frame={})
        with torch.inference_mode():
            for b in batches:
                hidden = torch.randn(b, 1, hidden_size, device="cuda", dtype=dtype,
                                     generator=gen)
                code0 = torch.randint(0, 2048, (b,), device="cuda", generator=gen)
                ms, got = time_replays(graphs, hidden, code0, a.iters)
                m["ms_per_frame"][b] = round(ms, 3)
                codes.setdefault(b, []).append((hidden, code0, got))
        res["modes"][mode] = m
        print(f"{mode}: start {m['start_s']}s, ms per frame " + ", ".join(
            f"b={b} {v}" for b, v in m["ms_per_frame"].items()), flush=True)
        del graphs
    # the same inputs through both: rerun the compiled graphs on the eager run's inputs
    same = {}
    graphs = CodePredictorGraphs(talker, "cuda", dtype, compile=True)
    with torch.inference_mode():
        for b, runs in codes.items():
            hidden, code0, eager = runs[0]
            compiled, _ = graphs(hidden, code0)
            same[b] = float((compiled == eager).float().mean())
    res["codes_equal_fraction"] = same
    e, c = res["modes"]["eager_graph"], res["modes"]["compiled_graph"]
    res["speedup"] = {b: round(e["ms_per_frame"][b] / c["ms_per_frame"][b], 2) for b in batches}
    print(f"speedup {res['speedup']}, codes equal {same}", flush=True)
    write_json("code_predictor_gpu.json", res, a.out_dir)
    return res


if __name__ == "__main__":
    main()
