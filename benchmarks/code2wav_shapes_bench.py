"""Code2wav's forwards at shapes met first, and padded up to a few warmed ones (code2wav_shapes.py).

The released code2wav shape (random weights) through the stateful decoder. For each (batch,
frames) pair of ``--pairs`` (streams already past their first chunk, as under load):

- ``first_ms`` / ``again_ms``: the pair's first forward on a decoder that never ran it, and the
  same forward again (on CUDA the first builds its convolutions' kernels);
- ``padded_ms``: the forward padded up to the next warmed pair (``PipelineConfig.code2wav_shapes``
  with ``--max-batch`` and the pipeline's chunk sizes), after the warm-up, p50 of ``--repeat``;
  ``exact_ms``: the unpadded forward, warm, p50 of ``--repeat``: what the padding costs;
- ``diff``: padded against unpadded audio, relative to the peak;
- ``graphed_ms`` / ``graph_diff`` (``--graphs``, CUDA): the padded forward replayed as a CUDA
  graph (code2wav_step_graphs.py), p50 of ``--repeat``, and its audio against the unpadded.

Plus ``warm_up_s``: running every warmed pair once, and ``graphs_s``: capturing and checking
their graphs, what a start pays.

    .venv/bin/python -m benchmarks.code2wav_shapes_bench --device cuda --dtype bfloat16
-> ``results/code2wav_shapes_<device>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.code2wav_batch_bench import build
from benchmarks.machine import RESULTS_DIR, machine_info, write_json
from omni_ray.config.pipeline import PipelineConfig
from omni_ray.runners.transformers.code2wav_shapes import ShapeBuckets
from omni_ray.runners.transformers.code2wav_step_graphs import StepGraphs
from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav, _shallow_copy

PAIRS = "3x5,5x13,7x25,11x9,2x17,6x3,13x25,20x7"  # (streams, longest new frames)
WARM_FRAMES = 4  # frames each stream decoded before: the pairs run with carried state


def _timed(device: str, fn) -> tuple[float, object]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, out


def _streams(stream: StreamingCode2Wav, codes: list[torch.Tensor]):
    """Fresh states, each advanced past ``WARM_FRAMES`` frames (one at a time: batch 1)."""
    states = [stream.new_state() for _ in codes]
    for s, c in zip(states, codes):
        stream.decode(s, c[:WARM_FRAMES])
    return states


def _diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    peak = max(w.float().abs().max().item() for w in want) or 1.0
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(got, want)) / peak


def bench_pair(plain: StreamingCode2Wav, padded: StreamingCode2Wav, batch: int, frames: int,
               repeat: int, device: str, gen: torch.Generator,
               graphed: StreamingCode2Wav | None = None) -> dict:
    q, size = plain.config.num_quantizers, plain.config.codebook_size
    codes = [torch.randint(0, size, (WARM_FRAMES + frames, q), generator=gen).to(device)
             for _ in range(batch)]
    new = [c[WARM_FRAMES:] for c in codes]

    def once(stream, states):
        # shallow copies: the forward assigns new tensors, so every run starts where these are
        return stream.decode_batch([_shallow_copy(s) for s in states], new)

    plain_states, padded_states = _streams(plain, codes), _streams(padded, codes)
    first_ms, want = _timed(device, lambda: once(plain, plain_states))
    again_ms, _ = _timed(device, lambda: once(plain, plain_states))
    exact = [_timed(device, lambda: once(plain, plain_states))[0] for _ in range(repeat)]
    shapes_before = padded.new_shapes
    pad = [_timed(device, lambda: once(padded, padded_states)) for _ in range(repeat)]
    out = dict(batch=batch, frames=frames, first_ms=first_ms, again_ms=again_ms,
               exact_ms=statistics.median(exact),
               padded_ms=statistics.median(t for t, _ in pad),
               padded_new_shapes=padded.new_shapes - shapes_before, diff=_diff(pad[-1][1], want))
    if graphed is not None:
        graphed_states = _streams(graphed, codes)
        calls = graphed.step_graphs.calls
        runs = [_timed(device, lambda: once(graphed, graphed_states)) for _ in range(repeat)]
        out.update(graphed_ms=statistics.median(t for t, _ in runs),
                   graph_replays=graphed.step_graphs.calls - calls,
                   graph_diff=_diff(runs[-1][1], want))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", default="real")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--pairs", default=PAIRS, help="comma list of BATCHxFRAMES")
    ap.add_argument("--max-batch", type=int, default=32, help="code2wav_max_batch")
    ap.add_argument("--first-chunk", type=int, default=2, help="initial_chunk_frames")
    ap.add_argument("--chunk", type=int, default=25, help="chunk_frames")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--graphs", action="store_true",
                    help="also the padded forwards replayed as CUDA graphs (CUDA only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results file name (default per device)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    model = build(a.setup, a.device, getattr(torch, a.dtype), a.seed).model
    sizes = PipelineConfig(code2wav_pad_shapes=True, code2wav_max_batch=a.max_batch,
                           initial_chunk_frames=a.first_chunk,
                           chunk_frames=a.chunk).code2wav_shapes(a.dtype)
    plain, padded = StreamingCode2Wav(model), StreamingCode2Wav(model)
    padded.buckets = ShapeBuckets(padded, *sizes)
    graphed = None
    if a.graphs:
        graphed = StreamingCode2Wav(model)
        graphed.buckets = ShapeBuckets(graphed, *sizes)
        graphed.step_graphs = StepGraphs(graphed, *sizes, capture=a.device.startswith("cuda"))
    gen = torch.Generator().manual_seed(a.seed)
    with torch.inference_mode():
        plain.decode(plain.new_state(), torch.zeros(1, model.config.num_quantizers,
                                                    dtype=torch.long, device=a.device))
        warm_up_ms, _ = _timed(a.device, padded.buckets.warm_up)
        print(f"warm-up: {padded.buckets.warmed} pairs {sizes} in {warm_up_ms / 1e3:.2f} s",
              flush=True)
        graphs_ms = 0.0
        if graphed is not None:
            graphed.buckets.warm_up()
            graphs_ms, _ = _timed(a.device, graphed.step_graphs.warm_up)
            print(f"graphs: {graphed.step_graphs.ready} of {len(graphed.step_graphs.pairs)} "
                  f"pairs captured and checked in {graphs_ms / 1e3:.2f} s", flush=True)
        results = []
        for pair in a.pairs.split(","):
            batch, frames = (int(x) for x in pair.split("x"))
            r = bench_pair(plain, padded, batch, frames, a.repeat, a.device, gen, graphed)
            graph = (f"; graphed {r['graphed_ms']:.1f} ({r['graph_replays']} replays), diff "
                     f"{r['graph_diff']:.1e}" if graphed is not None else "")
            print(f"{batch:3d} x {frames:2d} frames: first {r['first_ms']:.1f} ms, again "
                  f"{r['again_ms']:.1f}, warm {r['exact_ms']:.1f}; padded {r['padded_ms']:.1f} "
                  f"(new shapes {r['padded_new_shapes']}), diff {r['diff']:.1e} of peak{graph}",
                  flush=True)
            results.append(r)
    report = dict(machine=machine_info(), setup=a.setup, device=a.device, dtype=a.dtype,
                  sizes=sizes, warm_up_s=warm_up_ms / 1e3, graphs_s=graphs_ms / 1e3,
                  graphs_ready=graphed.step_graphs.ready if graphed is not None else 0,
                  warm_frames=WARM_FRAMES,
                  results=results)
    write_json(a.out or f"code2wav_shapes_{a.device.split(':')[0]}.json", report, a.out_dir)
    return report


if __name__ == "__main__":
    main()
