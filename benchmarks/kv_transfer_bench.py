"""KV hand-off of a disaggregated thinker (ThinkerPrefill -> ThinkerDecode) on the tiny checkpoint.

For a few prompt lengths: the KV bytes moved per request (the encoded ``KVChunk`` that the sender
``ray.put``s and the receiver fetches) and the hand-off latency, prefill done (EXTRACTED: the
sender's save finished) -> decode loaded (LOADED: the request is in the decode runner), split into
``fetch`` (-> TRANSFERRED: ``decode_open``, opening the request on a decode replica through Serve,
then the engine's fetch of the object) and ``load``. The requests go through the ingress's own hand-off code
(``DisaggPipelineClient``, driven from this process against the app's deployment handles), text
only, a few decode tokens each.

    python -m benchmarks.kv_transfer_bench        # -> results/kv_transfer_cpu.json, ~2 min
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from benchmarks.launch import LocalServe, tiny_model_dir
from benchmarks.machine import machine_info, write_json

APP = "kv-bench"
# Qwen3-Omni-30B-A3B's thinker (Qwen3-30B-A3B text model): 48 layers x 4 KV heads x 128 dims,
# bf16. What one prompt token would move there, for scale (the tiny model moves 1 KiB).
REAL_THINKER = dict(num_hidden_layers=48, num_key_value_heads=4, head_dim=128, dtype="bfloat16")


# vLLM on CPU for the tiny model: eager, a small KV cache, no prefix caching (every hand-off
# loads its KV); batched tokens cover the longest prompt (one prefill step).
VLLM_SIDE = {"backend": "vllm", "engine_kwargs": {
    "max_model_len": 4096, "max_num_batched_tokens": 2048, "max_num_seqs": 8,
    "kv_cache_memory_bytes": 128 << 20, "enable_prefix_caching": False}}


def _app_args(model_dir: str, max_prompt: int, backend: str = "transformers") -> dict:
    disagg = {"fallback": "error"}
    if backend == "vllm":
        disagg.update(prefill=VLLM_SIDE, decode=VLLM_SIDE,
                      timeouts={"prefill_s": 120.0, "transfer_s": 30.0, "load_s": 30.0})
    return {"model": model_dir, "model_id": "qwen3-omni",
            "limits": {"max_prompt_tokens": max_prompt}, "max_model_len": 4096,
            "thinker_disaggregation": disagg}


async def _one(client, prompt_len: int, i: int, max_tokens: int) -> dict:
    from omni_ray.config.request import OmniRequest

    # chat-template framing around a run of ordinary tokens: any ids work for the tiny model
    ids = [151644, 872, 198] + [(1000 + 7 * (i + j)) % 150000 for j in range(prompt_len - 5)] \
        + [151645, 198]
    req = OmniRequest(request_id=f"bench-{prompt_len}-{i}-{time.monotonic_ns()}",
                      prompt_token_ids=ids, modalities=("text",), max_tokens=max_tokens)
    stream = await client.open(req)
    async for _ in stream:
        pass
    return client.transfers.recent[-1]


def _ms(xs: list[float]) -> dict:
    xs = sorted(x * 1e3 for x in xs)
    return dict(p50=round(statistics.median(xs), 3), mean=round(statistics.fmean(xs), 3),
                min=round(xs[0], 3), max=round(xs[-1], 3))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="16,128,512,2048", help="prompt lengths in tokens")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--out", default=None, help="default: kv_transfer_cpu[_vllm]")
    p.add_argument("--backend", choices=("transformers", "vllm"), default="transformers",
                   help="both sides' thinker backend (vllm: omni_ray's vLLM KV connector)")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    out = args.out or ("kv_transfer_cpu" if args.backend == "transformers" else "kv_transfer_cpu_vllm")

    import torch
    from ray import serve

    from omni_ray import build_omni_app
    from omni_ray.config.serving import OmniServingArgs
    from omni_ray.ingress.kv_client import DisaggPipelineClient
    from omni_ray.models.loading import load_omni_config

    before = machine_info()
    model_dir = tiny_model_dir()
    rows = []
    with LocalServe():
        cfg = OmniServingArgs.model_validate(_app_args(model_dir, max(lengths), args.backend))
        serve.run(build_omni_app(cfg), name=APP, route_prefix=f"/{APP}")
        h = {s: serve.get_deployment_handle(f"{s}:qwen3-omni", app_name=APP)
             for s in ("ThinkerPrefill", "ThinkerDecode", "Talker", "Code2Wav")}

        async def run_all():
            client = DisaggPipelineClient(h["ThinkerPrefill"], h["ThinkerDecode"], h["Talker"],
                                          h["Code2Wav"], cfg.thinker_disaggregation)
            await _one(client, 16, -1, args.max_tokens)  # warm-up: first calls pay for setup
            for n in lengths:
                runs = [await _one(client, n, i, args.max_tokens) for i in range(args.repeats)]
                assert all(r["state"] == "RELEASED" for r in runs), runs
                rows.append(dict(
                    prompt_tokens=runs[0]["num_tokens"], kv_bytes=runs[0]["nbytes"],
                    kv_bytes_per_token=round(runs[0]["nbytes"] / runs[0]["num_tokens"], 1),
                    handoff_ms=_ms([r["handoff_s"] for r in runs]),
                    fetch_ms=_ms([r["fetch_s"] for r in runs]),
                    decode_open_ms=_ms([r["decode_open_s"] for r in runs]),
                    load_ms=_ms([r["load_s"] for r in runs]),
                    prefill_ms=_ms([r["prefill_s"] for r in runs]),
                    save_ms=_ms([r["save_s"] for r in runs])))
                r = rows[-1]
                print(f"prompt {r['prompt_tokens']:>5} tok: KV {r['kv_bytes'] / 1024:8.1f} KiB, "
                      f"hand-off p50 {r['handoff_ms']['p50']:7.2f} ms (decode open "
                      f"{r['decode_open_ms']['p50']:.2f} + fetch "
                      f"{r['fetch_ms']['p50'] - r['decode_open_ms']['p50']:.2f} + load "
                      f"{r['load_ms']['p50']:.2f})", flush=True)

        asyncio.run(run_all())
        text_cfg = load_omni_config(model_dir).thinker_config.text_config
        serve.delete(APP)

    from omni_ray.runners.kv import kv_bytes_per_token

    real = dict(REAL_THINKER)
    real_bpt = (2 * real["num_hidden_layers"] * real["num_key_value_heads"] * real["head_dim"]
                * torch.empty(0, dtype=getattr(torch, real["dtype"])).element_size())
    path = write_json(f"{out}.json", dict(
        benchmark="kv_transfer", backend=args.backend,
        what="thinker prefill -> decode KV hand-off, tiny checkpoint, "
        "CPU; hand-off = EXTRACTED (sender saved) -> LOADED (in the decode runner), as the "
        "ingress sees it", repeats=args.repeats, max_tokens=args.max_tokens,
        tiny_model=dict(layers=text_cfg.num_hidden_layers, kv_heads=text_cfg.num_key_value_heads,
                        head_dim=text_cfg.head_dim, dtype="float32",
                        kv_bytes_per_token=kv_bytes_per_token(text_cfg, torch.float32)),
        real_thinker_estimate=dict(**real, kv_bytes_per_token=real_bpt,
                                   kv_mib_at_prompt_tokens={n: round(n * real_bpt / 2**20, 1)
                                                            for n in lengths}),
        machine=dict(start=before, end=machine_info()), results=rows))
    last = rows[-1]
    print(f"kv_transfer: {len(rows)} lengths, {last['prompt_tokens']} tok -> "
          f"{last['kv_bytes'] / 2**20:.2f} MiB, hand-off p50 {last['handoff_ms']['p50']:.1f} ms; "
          f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
