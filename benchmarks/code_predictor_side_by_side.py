"""Do two talkers' code predictors run side by side on one GPU? (the ``talker2`` layout)

The talker's step is mostly the code predictor's CUDA graph: 15 sequential codebook steps of a
5-layer decoder, thousands of small kernels, bound by latency rather than by the GPU's width.
Two talker replicas (``talker.deployment_config.num_replicas: 2``) each run half the streams in
their own process; under MPS their kernels may run at once. This measures exactly that, on the
released code predictor (random weights) and nothing else on the GPU:

* ``alone``: one process replays its graph at batch ``b`` (what one talker does at c = b);
* ``side_by_side``: ``--procs`` processes replay at batch ``b`` at the same time (c = procs x b
  split over that many talkers).

Each process builds the code predictor and captures the yaml's graphs (compiled decoder with
``--compile``, fused GEMMs, sampled codes) for every batch, then runs each scenario for
``--seconds`` after a barrier. ``ms_per_frame`` is a replay's wall time: the frame period of every
stream in that process. The layout helps at c = procs x b when ``side_by_side[b]`` is below
``alone[procs x b]``. ``--mps`` starts a private MPS daemon first (omni_ray/mps.py); without it
the processes time-slice the GPU. CUDA; on CPU (``--device cpu``) the same plumbing runs the
eager decoder, for the tests.

    python -m benchmarks.code_predictor_side_by_side --batches 4,8,16,32 --procs 2 --mps --compile
-> ``results/code_predictor_side_by_side.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

from benchmarks.machine import RESULTS_DIR, machine_info, write_json


def _worker(rank: int, a: dict, env: dict, barriers: dict, conn) -> None:
    """One talker's code predictor: capture, then per command (group size, batch, seconds)
    replay after that group's barrier and send back (replays, seconds)."""
    os.environ.update(env)  # the MPS pipe before CUDA starts: this process is then a client
    import torch

    from benchmarks.code_predictor_bench import build
    from omni_ray.runners.transformers.code_predictor_graph import (CodePredictorGraphs,
                                                                    static_codes)

    dev, dtype = a["device"], getattr(torch, a["dtype"])
    talker = build(dev, dtype, seed=0)
    hidden = talker.codec_embedding.embedding_dim
    codebook = talker.code_predictor.lm_head[0].out_features
    gen = torch.Generator(device=dev).manual_seed(rank)
    inputs = {b: (torch.randn(b, 1, hidden, device=dev, dtype=dtype, generator=gen),
                  torch.randint(0, codebook, (b,), device=dev, generator=gen))
              for b in a["batches"]}
    t = time.perf_counter()
    if dev == "cuda":
        graphs = CodePredictorGraphs(talker, dev, dtype, compile=a["compile"], fuse=True)
        with torch.inference_mode():
            graphs.warm_up(max(a["batches"]), sample=True)

        def frame(b):
            graphs(*inputs[b], True)
    else:  # CPU: the same computation eagerly (no graphs)
        cfg = talker.code_predictor.model.config
        groups = len(talker.code_predictor.lm_head) + 1
        head = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)

        def frame(b):
            kv = [(torch.zeros(b, cfg.num_key_value_heads, groups, head, dtype=dtype),
                   torch.zeros(b, cfg.num_key_value_heads, groups, head, dtype=dtype))
                  for _ in range(cfg.num_hidden_layers)]
            static_codes(talker, *inputs[b], kv, sample=True)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        for b in a["batches"]:
            frame(b)
        sync()
        conn.send(round(time.perf_counter() - t, 1))  # ready: built and captured
        while (cmd := conn.recv()) is not None:
            size, b, seconds = cmd
            barriers[size].wait()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                frame(b)
                n += 1
                if n % 8 == 0:  # bounded queue of replays ahead of the GPU
                    sync()
            sync()
            conn.send((n, time.perf_counter() - t0))


def run(a: dict, env: dict) -> dict:
    """Start ``procs`` workers; ``alone`` (worker 0, the others wait) and ``side_by_side`` (all)
    for each batch."""
    ctx = mp.get_context("spawn")
    procs = a["procs"]
    conns, workers = [], []
    barriers = {1: ctx.Barrier(1), procs: ctx.Barrier(procs)}  # per scenario's group size
    for rank in range(procs):
        parent, child = ctx.Pipe()
        w = ctx.Process(target=_worker, args=(rank, a, env, barriers, child), daemon=True)
        w.start()
        conns.append(parent)
        workers.append(w)
    try:
        start_s = [c.recv() for c in conns]
        out = dict(start_s=start_s, alone={}, side_by_side={})
        for b in a["batches"]:
            for scenario, group in (("alone", conns[:1]), ("side_by_side", conns)):
                for c in group:
                    c.send((len(group), b, a["seconds"]))
                res = [c.recv() for c in group]
                ms = [round(1e3 * s / n, 3) for n, s in res]
                out[scenario][b] = dict(ms_per_frame=ms, frames=[n for n, _ in res],
                                        streams_frames_per_s=round(
                                            sum(b * n / s for n, s in res), 1))
                print(f"{scenario} b={b}: ms per frame {ms}", flush=True)
        return out
    finally:
        for c in conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                c.send(None)
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="4,8,16,32")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--compile", action="store_true", help="the compiled decoder (the yaml's)")
    ap.add_argument("--mps", action="store_true", help="under a private MPS daemon")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--name", default="code_predictor_side_by_side")
    args = ap.parse_args(argv)
    a = dict(batches=[int(b) for b in args.batches.split(",")], procs=args.procs,
             seconds=args.seconds, device=args.device, compile=args.compile,
             dtype=args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    with contextlib.ExitStack() as stack:
        env = {}
        if args.mps:
            from omni_ray.mps import mps_daemon

            env = stack.enter_context(mps_daemon(Path(tempfile.mkdtemp(prefix="cp_mps_"))))
        res = dict(machine=machine_info(), shape="qwen3-omni-30b-a3b", mps=args.mps, **a,
                   **run(a, env))
    # the layout's question: c = procs x b on one talker, or b on each of procs talkers
    res["layout"] = {}
    for b in a["batches"]:
        whole = b * a["procs"]
        if whole in res["alone"]:
            res["layout"][whole] = dict(
                one_talker_ms=res["alone"][whole]["ms_per_frame"][0],
                split_ms=max(res["side_by_side"][b]["ms_per_frame"]))
            print(f"c={whole}: one talker {res['layout'][whole]['one_talker_ms']} ms a frame, "
                  f"{a['procs']} talkers {res['layout'][whole]['split_ms']} ms", flush=True)
    write_json(f"{args.name}.json", res, args.out_dir)
    return res


if __name__ == "__main__":
    main()
