"""The talker's code predictor per frame in its CUDA graphs, at the released shape: greedy and
sampled, transformers' layers and ``FusedLayer``'s, the sampled codes drawn among the top
``CANDIDATES`` or the whole codebook; with ``--compile``, the torch.compile'd decoder
(``StageConfig.compile_graphs``) too.

Builds the released code predictor (5 layers, hidden 1024, random weights) and the talker's codec
embedding, captures ``CodePredictorGraphs`` per mode for each batch size, and times graph
replays (ms per frame for the whole batch: the 15 sequential codebook steps). Each greedy mode's
codes are compared with the first mode's on the same inputs (random weights in bfloat16: a rare
near-tie may pick differently). The start cost (compile + capture of the buckets) is reported
too. CUDA only.

    .venv/bin/python -m benchmarks.code_predictor_bench --batches 1,8,32 [--compile]
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
from omni_ray.runners.transformers.code_predictor_graph import (CANDIDATES, CodePredictorGraphs,
                                                                decoder_layers, head_step)


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


# name -> (compile, fuse, sample, draw among the whole codebook instead of ``CANDIDATES``)
MODES = {
    "greedy": (False, False, False, False),
    "greedy_fused": (False, True, False, False),
    "sampled_codebook": (False, True, True, True),
    "sampled": (False, True, True, False),
}
COMPILED_MODES = {  # --compile: the yaml's setting (compile_graphs and fused_code_predictor on)
    "greedy_compiled": (True, False, False, False),
    "greedy_compiled_fused": (True, True, False, False),
    "sampled_compiled_fused": (True, True, True, False),
    # the same with each step's head, filter and draw left eager (before session 21)
    "sampled_compiled_fused_eager_head": (True, True, True, False, False),
}


def time_replays(graphs: CodePredictorGraphs, hidden: torch.Tensor, code0: torch.Tensor,
                 iters: int, sample: bool) -> tuple[float, torch.Tensor]:
    codes, _ = graphs(hidden, code0, sample)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        graphs(hidden, code0, sample)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3, codes


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--compile", action="store_true",
                    help="also the compiled decoder (~100 s of compile and capture a mode)")
    ap.add_argument("--modes", default="", help="only these modes (comma-separated; default all)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    talker = build("cuda", dtype)
    batches = [int(b) for b in a.batches.split(",")]
    hidden_size = talker.codec_embedding.embedding_dim
    codebook = talker.code_predictor.lm_head[0].out_features
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = {b: (torch.randn(b, 1, hidden_size, device="cuda", dtype=dtype, generator=gen),
                  torch.randint(0, codebook, (b,), device="cuda", generator=gen))
              for b in batches}
    res: dict = dict(machine=machine_info(), shape="qwen3-omni-30b-a3b", dtype=a.dtype,
                     iters=a.iters, candidates=CANDIDATES, modes={})
    first_codes = None
    modes = MODES | (COMPILED_MODES if a.compile else {})
    if a.modes:
        modes = {m: modes[m] for m in a.modes.split(",")}
    for mode, (compile_, fuse, sample, whole, *head) in modes.items():
        graphs = CodePredictorGraphs(talker, "cuda", dtype, compile=compile_, fuse=fuse,
                                     sample_width=codebook if whole else CANDIDATES,
                                     compile_head=head[0] if head else True)
        t = time.perf_counter()
        with torch.inference_mode():
            graphs.warm_up(max(batches), sample)
        torch.cuda.synchronize()
        m = dict(compile=compile_, fuse=fuse, sample=sample, sample_width=graphs.sample_width,
                 start_s=round(time.perf_counter() - t, 1),
                 compiled=graphs.decoder is not decoder_layers,
                 compiled_head=graphs.head is not head_step, ms_per_frame={})
        codes = {}
        with torch.inference_mode():
            for b in batches:
                m["ms_per_frame"][b], codes[b] = time_replays(graphs, *inputs[b], a.iters,
                                                              sample)
                m["ms_per_frame"][b] = round(m["ms_per_frame"][b], 3)
        if not sample:  # greedy: the same codes as the first mode's, on the same inputs
            first_codes = first_codes or codes
            m["codes_equal_fraction"] = {b: float((codes[b] == first_codes[b]).float().mean())
                                         for b in batches}
        res["modes"][mode] = m
        print(f"{mode}: start {m['start_s']}s, ms per frame " + ", ".join(
            f"b={b} {v}" for b, v in m["ms_per_frame"].items()), flush=True)
        del graphs
        torch._dynamo.reset()  # each mode compiles afresh (dynamo's recompile limit is per function)
    base = res["modes"][next(iter(res["modes"]))]["ms_per_frame"]  # the first mode run
    res["speedup_vs_greedy"] = {mode: {b: round(base[b] / m["ms_per_frame"][b], 2)
                                       for b in batches} for mode, m in res["modes"].items()}
    print(f"speedup vs greedy {res['speedup_vs_greedy']}", flush=True)
    write_json("code_predictor_gpu.json", res, a.out_dir)
    return res


if __name__ == "__main__":
    main()
