"""Code2wav stage step: N streams' chunks in one batched forward vs one forward per stream.

The released code2wav shape (random weights, ``reinit_code2wav_for_testing``) through the
stage's runner (``Code2WavRunner``, stateful): N requests each stream ``--frames`` frames as the
app chunks them (a first chunk, then ``--chunk``-frame chunks); every round hands each request
its next chunk, decoded either with one ``decode_many`` (``code2wav_max_batch`` >= N, the
default) or one ``decode_many`` per request (``code2wav_max_batch: 1``). It reports ms per round
(the first, the 1-frame first chunks, is what a new request's first audio waits for), the
operators a batched round runs (``op_count.py``: kernel launches on CUDA), compute seconds per
audio second, and the largest difference between the two answers relative to the
peak (float32 noise: the math is the same).

    .venv/bin/python -m benchmarks.code2wav_batch_bench --device cuda --dtype bfloat16
-> ``results/code2wav_batch_<device>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeCode2WavConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from benchmarks.machine import RESULTS_DIR, machine_info, write_json
from benchmarks.op_count import OpCount
from benchmarks.vocoder_bench import SETUPS, chunk_bounds
from omni_ray.runners.transformers.code2wav import Code2WavRunner
from omni_ray.runners.transformers.code2wav_stream import reinit_code2wav_for_testing

SAMPLE_RATE = 24000


def build(setup: str, device: str, dtype: torch.dtype, seed: int = 0) -> Code2WavRunner:
    torch.manual_seed(seed)
    model = Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig(**SETUPS[setup])).eval()
    model = reinit_code2wav_for_testing(model, seed).to(device=device, dtype=dtype)
    return Code2WavRunner(model, mode="stateful", device=device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(runner: Code2WavRunner, codes: list[torch.Tensor], bounds, batched: bool, device: str,
        ops: list[int] | None = None) -> tuple[list[torch.Tensor], list[float]]:
    """Every request's audio and each round's seconds (all requests' chunk r in round r);
    ``ops``: appended each round's operator count (``OpCount``, not timed)."""
    rids = [f"r{i}" for i in range(len(codes))]
    for rid in rids:
        runner.add_request(rid)
    outs: list[list[torch.Tensor]] = [[] for _ in rids]
    times = []
    for s, e in bounds:
        items = [(rid, c[s:e]) for rid, c in zip(rids, codes)]
        _sync(device)
        t0 = time.perf_counter()
        with OpCount() if ops is not None else contextlib.nullcontext() as count:
            got = (runner.decode_many(items) if batched
                   else [runner.decode_many([item])[0] for item in items])
        _sync(device)
        if ops is not None:
            ops.append(count.total)
        times.append(time.perf_counter() - t0)
        for o, g in zip(outs, got):
            if isinstance(g, Exception):
                raise g
            o.append(g[1])
    for rid in rids:
        runner.finish(rid)
    return [torch.cat(o) for o in outs], times


def bench(runner: Code2WavRunner, n: int, frames: int, first: int, chunk: int, device: str,
          seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q, size = runner.model.config.num_quantizers, runner.model.config.codebook_size
    codes = [torch.randint(0, size, (frames, q), generator=gen) for _ in range(n)]
    bounds = chunk_bounds(frames, first, chunk)
    for batched in (True, False):  # kernels, allocator, cuDNN choices for these shapes
        run(runner, codes, bounds, batched, device)
    res = {}
    for name, batched in (("batched", True), ("one_by_one", False)):
        wavs, times = run(runner, codes, bounds, batched, device)
        audio_s = sum(w.numel() for w in wavs) / SAMPLE_RATE
        res[name] = dict(first_round_ms=times[0] * 1e3,
                         round_ms_p50=sorted(times)[len(times) // 2] * 1e3,
                         compute_s_per_audio_s=sum(times) / audio_s, wavs=wavs)
    ops: list[int] = []  # a host-cost proxy: the batched rounds' operators (launches on CUDA)
    run(runner, codes, bounds, True, device, ops)
    res["batched"].update(first_round_ops=ops[0], round_ops_p50=sorted(ops)[len(ops) // 2])
    a, b = res["batched"].pop("wavs"), res["one_by_one"].pop("wavs")
    peak = max(w.abs().max().item() for w in b)
    diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b)) / peak
    return dict(requests=n, frames=frames, first_chunk=first, chunk=chunk, rounds=len(bounds),
                max_abs_diff_rel_peak=diff,
                speedup=res["one_by_one"]["compute_s_per_audio_s"]
                / res["batched"]["compute_s_per_audio_s"], **res)


def line(r: dict) -> str:
    b, o = r["batched"], r["one_by_one"]
    return (f"first round {b['first_round_ms']:.1f} vs "
            f"{o['first_round_ms']:.1f} ms, round p50 {b['round_ms_p50']:.1f} vs "
            f"{o['round_ms_p50']:.1f} ms, batched ops first {b['first_round_ops']} / p50 "
            f"{b['round_ops_p50']}, {b['compute_s_per_audio_s']:.4f} vs "
            f"{o['compute_s_per_audio_s']:.4f} s/s (x{r['speedup']:.1f}), "
            f"diff {r['max_abs_diff_rel_peak']:.1e} of peak")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", default="real", choices=sorted(SETUPS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--requests", default="1,8,32", help="comma list of stream counts")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--first-chunk", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results file name (default per device)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    runner = build(a.setup, a.device, getattr(torch, a.dtype), a.seed)
    results = []
    with torch.inference_mode():
        for n in (int(x) for x in a.requests.split(",")):
            r = bench(runner, n, a.frames, a.first_chunk, a.chunk, a.device, a.seed)
            print(f"{n:3d} streams, batched vs one by one: {line(r)}", flush=True)
            results.append(r)
    report = dict(machine=machine_info(), setup=a.setup, device=a.device, dtype=a.dtype,
                  results=results)
    write_json(a.out or f"code2wav_batch_{a.device.split(':')[0]}.json", report, a.out_dir)
    return report


if __name__ == "__main__":
    main()
