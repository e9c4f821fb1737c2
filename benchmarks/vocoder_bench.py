"""Code2wav on CPU: stateful streaming vs left-context chunking vs one-shot.

For the tiny and the released-size code2wav (random weights, see `reinit_code2wav_for_testing`)
it measures compute seconds per second of audio and time to first audio for:
  stream  -- `StreamingCode2Wav`, first chunk 4 frames then 25 (exact);
  ctx25   -- re-decode 25 frames of left context per chunk, same chunking (approximate);
  oneshot -- the whole utterance in one forward (first audio only at the end).
It prints one line per setup and writes benchmarks/results/vocoder_cpu.json.

    .venv/bin/python -m benchmarks.vocoder_bench        # ~1.5-3 min on 2 cores (best of 3)
    .venv/bin/python -m benchmarks.vocoder_bench --setups tiny --frames 300
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from benchmarks.machine import RESULTS_DIR, machine_info, write_json
from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav, reinit_code2wav_for_testing

SAMPLE_RATE = 24000
SETUPS = {
    "tiny": dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        decoder_dim=64,
        sliding_window=72,
    ),
    "real": {},  # the config defaults are the released code2wav's shape
}
DEFAULT_FRAMES = {"tiny": 150, "real": 100}
RESULTS = RESULTS_DIR / "vocoder_cpu.json"


def chunk_bounds(frames: int, first: int, chunk: int) -> list[tuple[int, int]]:
    """[(start, end)] covering `frames`: one chunk of `first`, then chunks of `chunk`."""
    bounds, start = [], 0
    while start < frames:
        end = min(frames, start + (first if start == 0 else chunk))
        bounds.append((start, end))
        start = end
    return bounds


def run_stream(stream: StreamingCode2Wav, codes: torch.Tensor, bounds) -> tuple[torch.Tensor, list[float]]:
    state, outs, times = stream.new_state(), [], []
    for s, e in bounds:
        t0 = time.perf_counter()
        outs.append(stream.decode(state, codes[s:e]))
        times.append(time.perf_counter() - t0)
    return torch.cat(outs), times


@torch.no_grad()
def run_left_context(model, codes: torch.Tensor, bounds, ctx: int) -> tuple[torch.Tensor, list[float]]:
    """Re-decodes up to `ctx` frames before each chunk and keeps only the chunk's new samples."""
    spf = int(model.total_upsample)
    outs, times = [], []
    for s, e in bounds:
        t0 = time.perf_counter()
        c = min(ctx, s)
        w = model(codes[s - c : e].T[None]).flatten()
        tail = (e - s + c) * spf - len(w)  # the 555 samples that wait for the next frame
        outs.append(w if c == 0 else w[c * spf - tail :])
        times.append(time.perf_counter() - t0)
    return torch.cat(outs), times


@torch.no_grad()
def run_one_shot(model, codes: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    t0 = time.perf_counter()
    w = model(codes.T[None]).flatten()
    return w, [time.perf_counter() - t0]


def best_of(repeats: int, runs: dict) -> dict:
    """Runs every mode `repeats` times, round-robin so background load hits all modes alike, and
    keeps each mode's fastest total (CPU timings on shared hosts are noisy)."""
    best = {}
    for _ in range(repeats):
        for mode, run in runs.items():
            wav, times = run()
            if mode not in best or sum(times) < sum(best[mode][1]):
                best[mode] = (wav, times)
    return best


def bench_setup(name: str, frames: int, first: int, chunk: int, ctx: int, seed: int, repeats: int) -> dict:
    torch.manual_seed(seed)
    model = reinit_code2wav_for_testing(Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig(**SETUPS[name])).eval(), seed)
    stream = StreamingCode2Wav(model)
    codes = torch.randint(0, model.config.codebook_size, (frames, model.config.num_quantizers))
    bounds = chunk_bounds(frames, first, chunk)
    # 1) Warm up each path once (oneDNN builds its kernels on first use of a shape).
    warm = chunk_bounds(min(frames, first + chunk), first, chunk)
    run_stream(stream, codes, warm)
    run_left_context(model, codes, warm, ctx)
    # 2) Measure.
    modes = best_of(
        repeats,
        {
            "stream": lambda: run_stream(stream, codes, bounds),
            f"ctx{ctx}": lambda: run_left_context(model, codes, bounds, ctx),
            "oneshot": lambda: run_one_shot(model, codes),
        },
    )
    ref = modes["oneshot"][0]
    peak = ref.abs().max().item()
    audio_s = len(ref) / SAMPLE_RATE
    out = {
        "setup": name,
        "frames": frames,
        "audio_s": audio_s,
        "first_chunk": first,
        "chunk": chunk,
        "ctx": ctx,
        "repeats": repeats,
        "modes": {},
    }
    for mode, (wav, times) in modes.items():
        if wav.shape != ref.shape:
            raise RuntimeError(f"{name}/{mode}: {tuple(wav.shape)} samples, one-shot has {tuple(ref.shape)}")
        out["modes"][mode] = {
            "compute_s_per_audio_s": sum(times) / audio_s,
            "ttfa_s": times[0],
            "calls": len(times),
            "max_abs_diff_rel_peak": ((wav - ref).abs().max() / peak).item(),
        }
    return out


def summary_line(result: dict) -> str:
    parts = [f"{result['setup']:5s} {result['frames']} frames ({result['audio_s']:.1f} s audio)"]
    for mode, m in result["modes"].items():
        parts.append(
            f"{mode}: {m['compute_s_per_audio_s']:.3f} s/s, ttfa {m['ttfa_s'] * 1000:.0f} ms,"
            f" diff {m['max_abs_diff_rel_peak']:.1e}"
        )
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setups", default="tiny,real", help="comma list of: " + ",".join(SETUPS))
    parser.add_argument("--frames", type=int, default=None, help="frames per utterance (default per setup)")
    parser.add_argument("--first-chunk", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--ctx", type=int, default=25, help="left-context frames for the ctx mode")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine_start = machine_info()
    results = []
    for name in args.setups.split(","):
        if name not in SETUPS:
            raise ValueError(f"unknown setup {name!r}; choose from {sorted(SETUPS)}")
        frames = args.frames or DEFAULT_FRAMES[name]
        result = bench_setup(name, frames, args.first_chunk, args.chunk, args.ctx, args.seed, args.repeats)
        print(summary_line(result), flush=True)
        results.append(result)
    report = {
        "machine": machine_start,
        "machine_end": machine_info(),
        "torch_threads": torch.get_num_threads(),
        "results": results,
    }
    write_json(args.out.name, report, args.out.parent)
    return report

if __name__ == "__main__":
    main()
