"""Side by side, in one run, on the tiny checkpoint: where does a request's time go?

Setups (one request at a time, the same prompts, interleaved so that load drift on a shared
machine hits every setup alike):

* ``serve-async`` / ``serve-sync``: the Serve app (pipeline mode async_chunk / sync) over HTTP,
  streaming (TTFT / TTFA = first text / audio SSE packet);
* ``offline-async`` / ``offline-sync``: ``omni_ray.Omni`` in this process (same runners, no Ray);
* ``transformers``: ``Qwen3OmniMoeForConditionalGeneration.generate()`` (what a user runs without
  a server; no streaming, so its TTFT = TTFA = end-to-end);
* on request (``--setups``): ``serve-async-peritem``, the Serve app with ``stream_interval_ms: 0``
  (the engines send every item to the ingress alone), the A of that setting's A/B.

The offline runs are instrumented from the outside (``StageClock``) to split their time into
thinker steps, talker steps (of which the code predictor), code2wav decodes and codec hops. A
probe of minimal requests (4 tokens, 4 frames: transformers' ``generate`` fails on 1-token or
1-frame answers) measures the fixed per-request cost of each setup, and a text-only request of
``--max-tokens`` tokens the cost of the text path alone (per-token streaming).

    python -m benchmarks.compare            # -> benchmarks/results/compare_cpu.json (+ .png)

Torch threads: Ray starts the engine actors with ``OMP_NUM_THREADS=1`` (they ask for 0 CPUs), so
this process uses ``--torch-threads 1`` too by default; the JSON records what the actors got.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.client import chat_body, make_client, stream_chat
from benchmarks.machine import machine_info, write_json
from benchmarks.metrics import rtf, stats
from benchmarks.serve_bench import FIXED_PROMPTS
from benchmarks.stage_clock import StageClock

SETUPS = ("serve-async", "serve-sync", "offline-async", "offline-sync", "transformers")
# On request only: serve-async-peritem, the Serve app with stream_interval_ms 0 (an A/B)
EXTRA_SETUPS = ("serve-async-peritem",)
SERVE_SETUP = {"serve-async": "tiny-async", "serve-sync": "tiny-sync",
               "serve-async-peritem": "tiny-peritem-async"}
OFFLINE_MODE = {"offline-async": "async_chunk", "offline-sync": "sync"}
STAGES = ("thinker.step", "talker.step", "talker.code_predictor", "code2wav.decode", "codec_hop")
SPEAKER = "ethan"
PROBE = (4, 4)  # (max_tokens, max_audio_frames) of the fixed-cost probe and the warm-up
TARGET_TTFA_RATIO = 0.25    # async_chunk TTFA <= 0.25 x sync TTFA (c=1, >= 64 text tokens)
TARGET_OVERHEAD_PCT = 15.0  # Serve e2e within 15% of the offline pipeline's


class Offline:
    """Both offline modes, their stages timed by one clock (requests run one at a time)."""

    def __init__(self, model_dir: str, modes: list[str]):
        from omni_ray.offline import Omni

        self.clock = StageClock()
        self.omni = {}
        for mode in modes:
            o = Omni(model_dir, mode=mode)
            self.clock.wrap(o.thinker, "step", "thinker.step")
            self.clock.wrap(o.talker, "step", "talker.step")
            for attr in ("_residual_codes", "_residual_codes_batch"):  # one request / batched
                self.clock.wrap(o.talker, attr, "talker.code_predictor")
            self.clock.wrap(o.code2wav, "decode_many", "code2wav.decode")
            self._time_hops(o)
            self.omni[mode] = o

    def _time_hops(self, omni) -> None:
        """Every chunk the local pipeline carries between stages (its wire-codec transport)."""
        build = omni.local_pipeline

        def local_pipeline():
            pipe = build()
            pipe.transport = self.clock.timed(pipe.transport, "codec_hop")
            return pipe

        omni.local_pipeline = local_pipeline

    def run(self, mode: str, prompt: str, max_tokens: int, frames: int,
            modalities: tuple[str, ...] = ("text", "audio")) -> dict:
        from omni_ray.config.request import OmniRequest

        o = self.omni[mode]
        req = OmniRequest(request_id=f"bench-{time.monotonic_ns()}", speaker=SPEAKER,
                          prompt_token_ids=o.prompt_ids(prompt), max_tokens=max_tokens,
                          max_audio_frames=frames, modalities=modalities)
        self.clock.reset()
        t0 = time.perf_counter()
        out = o.generate(req)[0]
        e2e = time.perf_counter() - t0
        audio_s = out.audio.numel() / out.sample_rate
        # + 5 ms: the first audio is stamped just after the decode that made it returns
        first_audio = (None if out.time_to_first_audio is None
                       else t0 + out.time_to_first_audio + 0.005)
        return dict(ttft=out.time_to_first_token, ttfa=out.time_to_first_audio, e2e=e2e,
                    rtf=rtf(e2e, audio_s), audio_seconds=audio_s,
                    output_tokens=len(out.text_token_ids), text=out.text,
                    stages=self.clock.totals(), stages_to_first_audio=(
                        self.clock.totals(until=first_audio) if first_audio else None),
                    stage_calls=self.clock.counts())


class Transformers:
    """``Qwen3OmniMoeForConditionalGeneration.generate()``, greedy like the stages' defaults."""

    def __init__(self, model_dir: str):
        import warnings

        import torch
        from transformers import Qwen3OmniMoeForConditionalGeneration

        from omni_ray.models.tokenizer import encode_chat, load_tokenizer

        warnings.filterwarnings("ignore", message="Passing `repetition_penalty`")

        self.torch = torch
        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            model_dir, local_files_only=True, dtype=torch.float32).eval()
        self.tokenizer = load_tokenizer(model_dir)
        self.encode = lambda text: encode_chat(self.tokenizer, [{"role": "user", "content": text}])

    def run(self, prompt: str, max_tokens: int, frames: int,
            modalities: tuple[str, ...] = ("text", "audio")) -> dict:
        # The talker's first generated token comes with no codes: ask for one more to get
        # ``frames`` frames, as many as the stages produce.
        ids = self.encode(prompt)
        audio = "audio" in modalities
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            out = self.model.generate(
                input_ids=self.torch.tensor([ids]), speaker=SPEAKER, return_audio=audio,
                thinker_max_new_tokens=max_tokens, thinker_do_sample=False,
                talker_max_new_tokens=frames + 1, talker_do_sample=False,
                talker_repetition_penalty=1.05)
        e2e = time.perf_counter() - t0
        seqs, wav = out if audio else (out, self.torch.empty(0))
        new = seqs[0, len(ids):].tolist()
        audio_s = wav.numel() / 24000
        return dict(ttft=e2e, ttfa=e2e, e2e=e2e, rtf=rtf(e2e, audio_s), audio_seconds=audio_s,
                    output_tokens=len(new),
                    text=self.tokenizer.decode(new, skip_special_tokens=True))


async def serve_run(client, url: str, prompt: str, max_tokens: int, frames: int,
                    modalities: tuple[str, ...] = ("text", "audio")) -> dict:
    rec = await stream_chat(client, url, chat_body(prompt, model="qwen3-omni",
                                                   max_tokens=max_tokens, max_audio_frames=frames,
                                                   modalities=list(modalities), voice=SPEAKER))
    if not rec.ok:
        raise RuntimeError(f"{url}: request failed: {rec.error}")
    return dict(ttft=rec.ttft, ttfa=rec.ttfa, e2e=rec.e2e, rtf=rec.rtf,
                audio_seconds=rec.audio_seconds, output_tokens=rec.completion_tokens,
                text=rec.text)


def engine_threads() -> int:
    """torch threads in a Ray worker started like the engine actors (num_cpus=0)."""
    import ray

    @ray.remote(num_cpus=0)
    def threads():
        import torch

        return torch.get_num_threads()

    return ray.get(threads.remote())


async def measure(args, setups: list[str], urls: dict, offline: Offline | None,
                  tf: Transformers | None) -> tuple[dict, dict]:
    """(per-setup request results, per-setup probe results)."""
    from tqdm import tqdm

    async with make_client(1) as client:
        async def one(setup, prompt, max_tokens, frames, modalities=("text", "audio")):
            if setup in urls:
                return await serve_run(client, urls[setup], prompt, max_tokens, frames,
                                       modalities)
            if setup in OFFLINE_MODE:
                return offline.run(OFFLINE_MODE[setup], prompt, max_tokens, frames, modalities)
            return tf.run(prompt, max_tokens, frames, modalities)

        for setup in setups:  # warm-up: lazy loads, first-call costs
            await one(setup, FIXED_PROMPTS[-1], *PROBE)
        probe = {s: [] for s in setups}
        results = {s: [] for s in setups}
        prompts = FIXED_PROMPTS[:args.num_prompts]
        total = 2 * args.probe_reps * len(setups) + len(prompts) * len(setups)
        with tqdm(total=total, desc="compare", leave=True) as pbar:
            for rep in range(args.probe_reps):  # 1) fixed per-request cost; text path alone
                for setup in setups:
                    prompt = FIXED_PROMPTS[rep % len(FIXED_PROMPTS)]
                    r = await one(setup, prompt, *PROBE)
                    t = await one(setup, prompt, args.max_tokens, 1, ("text",))
                    probe[setup].append(dict(e2e=r["e2e"], ttft=r["ttft"], text_e2e=t["e2e"]))
                    pbar.update(2)
            for i, prompt in enumerate(prompts):  # 2) the workload, setups rotated per prompt
                for setup in setups[i % len(setups):] + setups[:i % len(setups)]:
                    r = await one(setup, prompt, args.max_tokens, args.max_audio_frames)
                    results[setup].append(dict(prompt_index=i, **r))
                    pbar.update(1)
    return results, probe


def p50(results: dict, setup: str, metric: str) -> float | None:
    return stats([r[metric] for r in results.get(setup, [])])["p50"]


def ratios(results: dict) -> tuple[dict, list[dict]]:
    """Ratios between setups (p50s) and the two targets with their status."""
    def ratio(a, b, metric):
        x, y = p50(results, a, metric), p50(results, b, metric)
        return None if x is None or not y else x / y

    out = {"ttfa_async_over_sync_serve": ratio("serve-async", "serve-sync", "ttfa"),
           "ttfa_async_over_sync_offline": ratio("offline-async", "offline-sync", "ttfa")}
    for mode in ("async", "sync"):
        r = ratio(f"serve-{mode}", f"offline-{mode}", "e2e")
        out[f"serve_overhead_pct_{mode}"] = None if r is None else (r - 1) * 100
    for metric in ("ttft", "ttfa", "e2e"):  # the stream_interval_ms A/B, when it ran
        out[f"{metric}_serve-async_over_peritem"] = ratio("serve-async", "serve-async-peritem",
                                                          metric)
    for s in SETUPS[:-1]:
        for metric in ("ttfa", "e2e"):
            out[f"{metric}_{s}_over_transformers"] = ratio(s, "transformers", metric)
    targets = []
    v = out["ttfa_async_over_sync_serve"]
    if v is not None:
        targets.append(dict(name="serve TTFA async_chunk / sync", value=v,
                            target=f"<= {TARGET_TTFA_RATIO}", met=v <= TARGET_TTFA_RATIO,
                            missed_by=max(0.0, v - TARGET_TTFA_RATIO)))
    for mode in ("async", "sync"):
        v = out[f"serve_overhead_pct_{mode}"]
        if v is not None:
            targets.append(dict(name=f"Serve e2e overhead vs offline ({mode}), %", value=v,
                                target=f"< {TARGET_OVERHEAD_PCT}", met=v < TARGET_OVERHEAD_PCT,
                                missed_by=max(0.0, v - TARGET_OVERHEAD_PCT)))
    return out, targets


def overhead_split(results: dict, probe: dict) -> dict:
    """Serve minus offline (p50 seconds, per mode): the whole request, the fixed-cost probe, and
    the text-only request (thinker + per-token streaming, no audio stages)."""
    out = {}
    for mode in ("async", "sync"):
        s, o = f"serve-{mode}", f"offline-{mode}"
        if s not in results or o not in results:
            continue

        def diff(res, metric):
            a, b = p50(res, s, metric), p50(res, o, metric)
            return None if a is None or b is None else a - b

        out[mode] = dict(e2e_s=diff(results, "e2e"), ttft_s=diff(results, "ttft"),
                         ttfa_s=diff(results, "ttfa"), fixed_probe_s=diff(probe, "e2e"),
                         text_only_s=diff(probe, "text_e2e"))
    return out


def breakdown(results: dict) -> dict:
    """Mean seconds per stage of the offline runs, for e2e and (async) up to the first audio."""
    out = {}
    for setup in OFFLINE_MODE:
        rs = results.get(setup) or []
        if not rs:
            continue
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        e2e = {k: mean([r["stages"].get(k, 0.0) for r in rs]) for k in STAGES}
        e2e["total_e2e"] = mean([r["e2e"] for r in rs])
        nested = "talker.code_predictor"  # inside talker.step
        e2e["other"] = e2e["total_e2e"] - sum(e2e[k] for k in STAGES if k != nested)
        first = {k: mean([(r["stages_to_first_audio"] or {}).get(k, 0.0) for r in rs])
                 for k in STAGES}
        first["total_ttfa"] = mean([r["ttfa"] for r in rs])
        calls = {k: mean([r["stage_calls"].get(k, 0) for r in rs]) for k in STAGES}
        out[setup] = dict(e2e=e2e, to_first_audio=first, calls_per_request=calls)
    return out


def print_report(results, probe, ratio_vals, targets, stage_split, split) -> None:
    f = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    print(f"\n{'setup':15} {'TTFT p50':>9} {'TTFA p50':>9} {'e2e p50':>8} {'RTF p50':>8} "
          f"{'audio s':>8} {'tokens':>6} {'probe e2e':>9} {'text-only e2e':>13}")
    for s in results:
        print(f"{s:15} {f(p50(results, s, 'ttft')):>9} {f(p50(results, s, 'ttfa')):>9} "
              f"{f(p50(results, s, 'e2e')):>8} {f(p50(results, s, 'rtf')):>8} "
              f"{f(p50(results, s, 'audio_seconds'), 2):>8} "
              f"{f(p50(results, s, 'output_tokens'), 0):>6} {f(p50(probe, s, 'e2e')):>9} "
              f"{f(p50(probe, s, 'text_e2e')):>13}")
    print("\nratios (p50s):")
    for k, v in ratio_vals.items():
        print(f"  {k:42} {f(v)}")
    print("\ntargets (reported, not asserted):")
    for t in targets:
        status = "met" if t["met"] else f"MISSED by {t['missed_by']:.3f}"
        print(f"  {t['name']:42} {t['value']:.3f} (target {t['target']}): {status}")
    for mode, d in split.items():
        print(f"serve - offline ({mode}), s: " + ", ".join(f"{k}={f(v)}" for k, v in d.items()))
    for setup, b in stage_split.items():
        print(f"\n{setup} mean seconds per request: " + ", ".join(
            f"{k}={v:.3f}" for k, v in b["e2e"].items()))
        if setup == "offline-async":
            print("  up to the first audio: " + ", ".join(
                f"{k}={v:.3f}" for k, v in b["to_first_audio"].items()))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("ttfa", "e2e")):
        vals = [p50(results, s, metric) or 0.0 for s in setups]
        ax.bar(setups, vals, color=["C0", "C1", "C2", "C3", "C7", "C4"][:len(setups)])
        ax.set_title(f"{metric.upper()} p50 (s), concurrency 1")
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-audio-frames", type=int, default=150)
    ap.add_argument("--probe-reps", type=int, default=3, help="minimal requests per setup")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--model-dir", default=None, help="default: the tiny checkpoint")
    ap.add_argument("--out", default="compare_cpu")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = parse_args(argv)
    import torch

    from benchmarks.launch import LocalServe, tiny_model_dir

    torch.set_num_threads(args.torch_threads)
    setups = [s for s in args.setups.split(",") if s]
    unknown = set(setups) - set(SETUPS) - set(EXTRA_SETUPS)
    if unknown:
        raise SystemExit(f"unknown setup(s) {sorted(unknown)}; known: {list(SETUPS)}")
    before = machine_info()
    model_dir = args.model_dir or tiny_model_dir()
    with LocalServe() as ls:
        urls = {s: ls.deploy(SERVE_SETUP[s], model_dir) for s in setups if s in SERVE_SETUP}
        actor_threads = engine_threads()
        modes = [OFFLINE_MODE[s] for s in setups if s in OFFLINE_MODE]
        offline = Offline(model_dir, modes) if modes else None
        tf = Transformers(model_dir) if "transformers" in setups else None
        results, probe = asyncio.run(measure(args, setups, urls, offline, tf))
    ratio_vals, targets = ratios(results)
    stage_split = breakdown(results)
    texts = {i: {r["text"] for s in setups for r in results[s] if r["prompt_index"] == i}
             for i in range(args.num_prompts)}
    split = overhead_split(results, probe)
    print_report(results, probe, ratio_vals, targets, stage_split, split)
    summary = {s: {m: stats([r[m] for r in results[s]]) for m in
                   ("ttft", "ttfa", "e2e", "rtf", "audio_seconds", "output_tokens")}
               for s in setups}
    path = write_json(f"{args.out}.json", dict(
        benchmark="compare", config=vars(args), model_dir=model_dir,
        torch_threads=dict(this_process=torch.get_num_threads(), serve_engine_actor=actor_threads),
        machine=dict(start=before, end=machine_info()), summary=summary, ratios=ratio_vals,
        targets=targets, stage_breakdown=stage_split, serve_overhead_split=split,
        probe={s: {m: stats([r[m] for r in probe[s]]) for m in ("e2e", "ttft", "text_e2e")}
               for s in setups},
        same_text_across_setups={i: len(t) == 1 for i, t in texts.items()},
        requests=results))
    plot(results, path.with_suffix(".png"))
    print(f"\nwrote {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
