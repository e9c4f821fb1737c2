"""The vLLM talker alone, its step synchronous against vLLM's async scheduling, in one process.

A real-size talker (Qwen3-Omni-30B-A3B's talker shape, random weights: vLLM's ``load_format:
dummy`` for the backbone, seeded init for the code predictor and embeddings) runs the same
requests twice: on vLLM's synchronous scheduler (the default) and with
``engine_kwargs.async_scheduling`` (vLLM prepares step k+1 while the device runs step k). The
thinker's text is all known up front (the talker is never held for it) and every answer runs
to ``--frames`` (``ignore_eos``), so both arms make the same frames a level; what differs is the
talker's milliseconds a step (one frame per request a step). Greedy frames are compared between
the arms (they must be equal, bf16 kernels and batch shapes being the same).

    python -m benchmarks.talker_step_bench --device cuda --out /tmp/out
    python -m benchmarks.talker_step_bench --device cpu --smoke --out /tmp/out  # the script works

-> ``talker_step_<device>.json`` and a line per level and arm.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from omni_ray.config.sampling import SamplingParams

ARMS = ("sync", "async")


def build(smoke: bool, device: str):
    """(checkpoint dir, transformers talker, text embedding, config) at the real shape (or the
    smoke shape), random weights."""
    from transformers import Qwen3OmniMoeConfig

    from benchmarks.gpu_run import build_dummy_stages, realsize_config
    from omni_ray.models.tiny import write_tokenizer

    ckpt = Path(tempfile.mkdtemp(prefix="omni_talker_bench_")) / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(realsize_config(smoke), indent=2))
    write_tokenizer(ckpt)
    cfg = Qwen3OmniMoeConfig.from_pretrained(str(ckpt), local_files_only=True)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    talker, emb, _ = build_dummy_stages(cfg, device, dtype)
    return ckpt, talker, emb, cfg


def prompts(ckpt: Path, n: int) -> list[list[int]]:
    """n chat-formatted prompts of 30-100 tokens (the offline real-size bench's)."""
    from benchmarks.gpu_run import LONG_TEXT
    from omni_ray.models.tokenizer import encode_chat, load_tokenizer

    tok, words = load_tokenizer(ckpt), LONG_TEXT.split()
    return [encode_chat(tok, [{"role": "user", "content": f"[{i}] " + " ".join(
        words[:12 + (i * 37) % (len(words) - 12)])}]) for i in range(n)]


def level(runner, ckpt: Path, n: int, text_tokens: int, frames: int, params) -> dict:
    """n requests at once, all text known; ms a step and the frames each made."""
    g = torch.Generator().manual_seed(n)
    for i, prompt in enumerate(prompts(ckpt, n)):
        rid = f"c{n}-{i}"
        runner.add_request(rid, "ethan", params, frames)
        text = torch.randint(1000, 20000, (text_tokens,), generator=g).tolist()
        runner.push_text(rid, text, True, prompt_token_ids=prompt)
    got: dict[str, list] = {}
    steps, t0, first = [], time.perf_counter(), None
    while runner.has_unfinished():
        s0 = time.perf_counter()
        outs = runner.step()
        steps.append(time.perf_counter() - s0)
        for o in outs:
            got.setdefault(o.request_id, []).append(o.frames)
            if first is None and o.frames.shape[0]:
                first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    made = {rid: torch.cat(f) for rid, f in got.items()}
    decode = sorted(steps)[len(steps) // 10:]  # without the admission steps at the start
    return dict(requests=n, steps=len(steps), wall_s=round(wall, 3),
                ms_per_step_mean=round(1e3 * wall / len(steps), 2),
                ms_per_step_p50=round(1e3 * statistics.median(decode), 2),
                frames_per_s=round(sum(f.shape[0] for f in made.values()) / wall, 1),
                first_frame_s=round(first or 0.0, 4),
                frames=sum(f.shape[0] for f in made.values()), _frames=made)


def run_arm(arm: str, ckpt, talker, emb, cfg, args) -> dict:
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    cuda = args.device == "cuda"
    kwargs = dict(dtype="bfloat16" if cuda else "float32", load_format="dummy",
                  gpu_memory_utilization=0.1, kv_cache_memory_bytes=(4 << 30) if cuda else 256 << 20,
                  max_model_len=4096, enforce_eager=not cuda, async_scheduling=arm == "async")
    t0 = time.perf_counter()
    runner = VllmTalkerRunner(ckpt, talker, emb, cfg, device=args.device,
                              max_num_seqs=max(args.concurrency), engine_kwargs=kwargs,
                              fused_code_predictor=cuda)  # as the app's bf16 talker
    runner.warm_up()
    out = dict(arm=arm, start_s=round(time.perf_counter() - t0, 1), levels=[])
    params = SamplingParams(repetition_penalty=1.05, ignore_eos=True)  # greedy: comparable
    try:
        level(runner, ckpt, 2, 8, 8, params)  # warm: kernels, allocator
        for n in args.concurrency:
            out["levels"].append(level(runner, ckpt, n, args.text_tokens, args.frames, params))
            lv = out["levels"][-1]
            print(f"{arm} c={n}: {lv['ms_per_step_p50']} ms/step p50 "
                  f"({lv['ms_per_step_mean']} mean over {lv['steps']} steps), "
                  f"{lv['frames_per_s']} frames/s, first frame {lv['first_frame_s']} s",
                  flush=True)
        out["time_spent"] = dict(runner.time_spent)
    finally:
        runner.shutdown()
        del runner
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="the CPU-sized shape: the script works")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--text-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    ckpt, talker, emb, cfg = build(args.smoke, args.device)
    res = dict(device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               frames=args.frames, text_tokens=args.text_tokens, arms={})
    for arm in ARMS:
        res["arms"][arm] = run_arm(arm, ckpt, talker, emb, cfg, args)
    same = []
    for a, b in zip(res["arms"]["sync"]["levels"], res["arms"]["async"]["levels"]):
        fa, fb = a.pop("_frames"), b.pop("_frames")
        same.append(all(torch.equal(fa[r], fb[r]) for r in fa) and set(fa) == set(fb))
        print(f"c={a['requests']}: sync {a['ms_per_step_p50']} -> async {b['ms_per_step_p50']} "
              f"ms/step p50, frames/s {a['frames_per_s']} -> {b['frames_per_s']}, "
              f"same frames {same[-1]}", flush=True)
    res["same_frames"] = same
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"talker_step_{args.device}.json").write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
