"""Load generator against the OpenAI endpoint: TTFT, TTFA, RTF, stall, e2e, throughput.

Against a running app::

    python -m benchmarks.serve_bench --url http://127.0.0.1:8000 --concurrency 1,4,8

Or start the app itself, one setup after the other, in one command (each setup is a Serve app on
a local Ray cluster, torn down at the end)::

    python -m benchmarks.serve_bench --start tiny-async,tiny-sync --concurrency 1,2,4

Closed loop (``--concurrency``: N clients back to back) or open loop (``--request-rate``: Poisson
arrivals at R requests/s). Writes ``benchmarks/results/<out>.json`` and ``<out>.png`` (TTFA and
RTF p50 against the load, one line per label) and prints one summary line per load level.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.client import chat_body, make_client, served_model, spoken_question, stream_chat
from benchmarks.machine import RESULTS_DIR, machine_info, write_json
from benchmarks.metrics import RequestRecord, summarize
from benchmarks.overrides import parse_variant

FIXED_PROMPTS = [
    "Tell me a short story about a dragon who learns to sing.",
    "Explain how a rainbow forms, in simple words.",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Describe your favourite city and why people love to visit it.",
    "Give me three tips for learning to play the guitar.",
    "How do bees make honey? Please explain step by step.",
    "Write a friendly message inviting a neighbour to dinner.",
    "Why is the sky blue during the day and red at sunset?",
]

_WORDS = ("time person year way day thing man world life hand part child eye woman place work "
          "week case point number group problem fact good new first last long great little own "
          "other old right big high different small large next early young important few public "
          "bad same able river music garden window morning story light water city road table "
          "paper house voice song travel market summer winter animal forest ocean mountain").split()


def make_prompts(kind: str, n: int, input_len: int, seed: int,
                 len_range: tuple[int, int] = (32, 2000)) -> list[str]:
    """``fixed``: the built-in set, cycled; ``random``: ``input_len`` random common words each
    (about one token a word with Qwen's tokenizer); ``mixed``: random words, each prompt's length
    log-uniform in ``len_range`` (short questions and long documents in one stream)."""
    if kind == "fixed":
        return [FIXED_PROMPTS[i % len(FIXED_PROMPTS)] for i in range(n)]
    rng = random.Random(seed)
    lo, hi = len_range
    sizes = ([input_len] * n if kind == "random" else
             [round(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(n)])
    return [" ".join(rng.choice(_WORDS) for _ in range(k)) for k in sizes]


async def closed_loop(client, url: str, bodies: list[dict], concurrency: int, pbar
                      ) -> tuple[list[RequestRecord], float]:
    """``concurrency`` workers send the bodies back to back; returns records and wall time."""
    todo = list(enumerate(bodies))
    records: list[RequestRecord | None] = [None] * len(bodies)

    async def worker():
        while todo:
            i, body = todo.pop(0)
            records[i] = await stream_chat(client, url, body)
            pbar.update(1)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    return records, time.perf_counter() - t0


async def open_loop(client, url: str, bodies: list[dict], rate: float, seed: int, pbar
                    ) -> tuple[list[RequestRecord], float]:
    """Poisson arrivals at ``rate`` requests/s (exponential gaps, seeded), no concurrency cap."""
    rng = random.Random(seed)

    async def one(body):
        rec = await stream_chat(client, url, body)
        pbar.update(1)
        return rec

    t0 = time.perf_counter()
    tasks = []
    for i, body in enumerate(bodies):
        if i:
            await asyncio.sleep(rng.expovariate(rate))
        tasks.append(asyncio.create_task(one(body)))
    records = await asyncio.gather(*tasks)
    return list(records), time.perf_counter() - t0


async def bench_url(url: str, label: str, args) -> list[dict]:
    """Every load level of ``args`` against ``url``; returns one result dict per level."""
    from tqdm import tqdm

    from benchmarks import step_profile, step_trace

    levels = ([("rate", r) for r in _floats(args.request_rate)] if args.request_rate
              else [("concurrency", c) for c in _ints(args.concurrency)])
    max_c = max(int(v) if k == "concurrency" else requests_per_level(args, v) for k, v in levels)
    async with make_client(max_c) as client:
        model = args.model_id or await served_model(client, url)
        max_tokens = args.output_len if args.prompts == "random" else args.max_tokens

        speech = spoken_question(args.audio_input_seconds) if args.audio_input_seconds else None

        def bodies(n, seed):
            return [chat_body(p, model=model, max_tokens=max_tokens,
                              max_audio_frames=args.max_audio_frames,
                              modalities=args.modalities.split(","), audio_input=speech,
                              ignore_eos=args.ignore_eos)
                    for p in make_prompts(args.prompts, n, args.input_len, seed,
                                          _ints(args.input_len_range))]

        for body in bodies(args.warmup, args.seed + 999):  # loads models, starts loops
            rec = await stream_chat(client, url, body)
            if rec.error:
                raise RuntimeError(f"{label}: warm-up request failed: {rec.error}")
        results = []
        for kind, value in levels:
            if args.warmup_burst and kind == "concurrency":
                await warm_up_burst(client, url, bodies(int(value), args.seed + 998), int(value),
                                    label)
            batch = bodies(requests_per_level(args, value if kind == "concurrency" else 0),
                           args.seed)
            stats_before = await asyncio.to_thread(step_profile.fetch, url,
                                                     samples=step_profile.SAMPLES)
            t_level = time.time()  # the engines' step records from here (wall clock)
            with tqdm(total=len(batch), desc=f"{label} {kind}={value}", leave=True) as pbar:
                if kind == "rate":
                    recs, wall = await open_loop(client, url, batch, value, args.seed, pbar)
                else:
                    recs, wall = await closed_loop(client, url, batch, value, pbar)
            summary = summarize(recs, wall)
            print(summary_line(label, kind, value, summary), flush=True)
            ttfa = await ttfa_breakdown(url, [r.request_id for r in recs])
            marks = ttfa.pop("ttfa_marks")
            t_ref = min((m["ingress"]["received"] for m in marks
                         if "received" in m.get("ingress", {})), default=t_level)
            trace = await asyncio.to_thread(step_trace.fetch, url, t_level)
            results.append(dict(label=label, load=kind, value=value, summary=asdict(summary),
                                stall_p99_s=summary.metrics["stall_s"]["p99"],
                                realtime_frac=summary.realtime_frac,
                                requests=[r.summary() for r in recs], **ttfa,
                                step_trace=step_trace.summarize(
                                    trace, marks, t_ref,
                                    burst=int(value) if kind == "concurrency" else None),
                                step_profile=step_profile.diff(
                                    stats_before,
                                    await asyncio.to_thread(step_profile.fetch, url,
                                                            samples=step_profile.SAMPLES),
                                    wall)))
    return results


async def warm_up_burst(client, url: str, bodies: list[dict], concurrency: int,
                        label: str) -> None:
    """One unmeasured request per client, all at once, before a level: what a level's batch
    shapes first cost (code2wav builds its convolutions' kernels per new batch and chunk length,
    session 26) falls here, not on whichever arm of an A/B happens to run first."""
    from tqdm import tqdm

    with tqdm(total=len(bodies), desc=f"{label} warm-up c={concurrency}", leave=False) as pbar:
        recs, _ = await closed_loop(client, url, bodies, concurrency, pbar)
    failed = [r.error for r in recs if r.error]
    if failed:
        raise RuntimeError(f"{label}: warm-up burst c={concurrency}: {len(failed)} failed, "
                           f"first: {failed[0]}")


async def ttfa_breakdown(url: str, request_ids: list[str | None]) -> dict:
    """The app's milestones of the level's requests, by id, split into stages and hops:
    ``ttfa_breakdown`` (stats per segment), ``ttfa_requests`` (each request's segments),
    ``ttfa_requests_missing``, ``ttfa_ingress_breakdown`` (the first segment split); None
    when /debug is off; and ``ttfa_marks``, the milestones themselves (for
    benchmarks/step_trace.py, not for the results file). Each ingress replica keeps its own requests (the one-GPU yaml runs two)
    and Serve routes each fetch to one of them, so the fetches are repeated (up to 20) until
    every id has turned up."""
    from benchmarks import timeline

    want = {i for i in request_ids if i}
    found: dict[str, dict] = {}
    for _ in range(20):
        reqs = await asyncio.to_thread(timeline.fetch, url, min(1024, max(64, 4 * len(want))))
        if reqs is None:
            return dict(ttfa_breakdown=None, ttfa_requests=None, ttfa_requests_missing=None,
                        ttfa_ingress_breakdown=None, ttfa_marks=[])
        found.update((r["request_id"], r) for r in reqs if r["request_id"] in want)
        if len(found) >= len(want):
            break
        await asyncio.sleep(0.1)
    got = list(found.values())
    return dict(ttfa_breakdown=timeline.breakdown(got), ttfa_requests=timeline.per_request(got),
                ttfa_requests_missing=len(want) - len(got),
                ttfa_ingress_breakdown=timeline.breakdown(
                    got, [*timeline.INGRESS_PARTS, timeline.INGRESS_AFTER]), ttfa_marks=got)


def requests_per_level(args, concurrency: int) -> int:
    """``--num-requests``, or with 0 max(2 x concurrency, 8) (every client sends at least 2)."""
    return args.num_requests or max(2 * int(concurrency), 8)


def bench(url: str, label: str = "url", **options) -> list[dict]:
    """``bench_url`` from Python: ``options`` are this CLI's flags with underscores, e.g.
    ``bench(url, concurrency="1,8", num_requests=0, max_tokens=128)``."""
    args = parse_args([])
    unknown = sorted(set(options) - set(vars(args)))
    if unknown:
        raise TypeError(f"unknown serve_bench option(s) {unknown}")
    vars(args).update(options)
    return asyncio.run(bench_url(url.rstrip("/"), label, args))


def summary_line(label: str, kind: str, value, s) -> str:
    m = s.metrics

    def p(name, q="p50"):
        v = m[name][q]
        return "-" if v is None else f"{v:.3f}"

    frac = "-" if s.realtime_frac is None else f"{s.realtime_frac:.2f}"
    return (f"[{label}] {kind}={value} ok={s.num_ok}/{s.num_requests} "
            f"ttft p50={p('ttft')}s ttfa p50={p('ttfa')}s p99={p('ttfa', 'p99')}s "
            f"rtf p50={p('rtf')} text_rtf p50={p('text_rtf')} stall p99={p('stall_s', 'p99')}s "
            f"realtime={frac} "
            f"e2e p50={p('e2e')}s req/s={s.requests_per_s:.3f} "
            f"tok/s={s.output_tokens_per_s:.1f} audio_s/s={s.audio_seconds_per_s:.2f}")


def plot(runs: list[dict], path: Path) -> None:
    """TTFA p50 and RTF p50 against the load level, one line per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label in dict.fromkeys(r["label"] for r in runs):
        rs = [r for r in runs if r["label"] == label]
        xs = [r["value"] for r in rs]
        for ax, metric in zip(axes, ("ttfa", "rtf")):
            ax.plot(xs, [r["summary"]["metrics"][metric]["p50"] for r in rs], marker="o",
                    label=label)
    xlabel = "request rate (req/s)" if runs and runs[0]["load"] == "rate" else "concurrency"
    for ax, title in zip(axes, ("TTFA p50 (s)", "RTF p50 (gen. time / audio s)")):
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--start", default="", help="comma list of setups to start locally "
                    "(tiny-async, tiny-sync, tiny-ramp-async, tiny-vllm-async), one after the other; overrides --url")
    ap.add_argument("--model-dir", default=None, help="checkpoint for --start (default: tiny)")
    ap.add_argument("--ab", action="append", default=[], type=parse_variant,
                    metavar="NAME:K=V,...",
                    help="with --start: each setup again with these app args (dotted, e.g. "
                    "pipeline.code2wav_urgent_ms=200), labelled SETUP-NAME; repeatable")
    ap.add_argument("--model-id", default=None, help="default: the first of /v1/models")
    ap.add_argument("--label", default=None, help="line label (default: the setup, or 'url')")
    ap.add_argument("--prompts", choices=("fixed", "random", "mixed"), default="fixed")
    ap.add_argument("--input-len-range", default="32,2000",
                    help="mixed prompts: words per prompt, log-uniform in LO,HI")
    ap.add_argument("--input-len", type=int, default=32, help="words per random prompt")
    ap.add_argument("--output-len", type=int, default=64, help="max_tokens for random prompts")
    ap.add_argument("--num-requests", type=int, default=8,
                    help="per load level; 0: max(2 x concurrency, 8)")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--request-rate", default="", help="comma list of req/s (Poisson); "
                    "replaces the --concurrency sweep")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-audio-frames", type=int, default=150)
    ap.add_argument("--modalities", default="text,audio")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every answer runs to --max-tokens and its audio to "
                    "--max-audio-frames (the request's ignore_eos): fixed lengths")
    ap.add_argument("--audio-input-seconds", type=float, default=0.0,
                    help="speech in: a generated wav of this length before each prompt's text")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--warmup-burst", action="store_true",
                    help="before each concurrency level, one unmeasured request per client, "
                    "all at once (the level's batch shapes met before it is measured)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="serve_bench", help="results/<out>.json and .png")
    ap.add_argument("--append", action="store_true",
                    help="keep other labels already in results/<out>.json")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = parse_args(argv)
    before = machine_info()
    runs: list[dict] = []
    if args.start:
        from benchmarks.launch import LocalServe, tiny_model_dir

        model_dir = args.model_dir or tiny_model_dir()
        with LocalServe() as ls:
            for setup in args.start.split(","):
                for name, over in [(None, {}), *args.ab]:  # the setup, then its variants
                    app = f"{setup}-{name}" if name else setup
                    url = ls.deploy(setup, model_dir, over, app)
                    runs += asyncio.run(bench_url(url, args.label or app, args))
                    ls.undeploy(app)
    else:
        runs = asyncio.run(bench_url(args.url.rstrip("/"), args.label or "url", args))
    out_json = RESULTS_DIR / f"{args.out}.json"
    if args.append and out_json.exists():
        import json

        new_labels = {r["label"] for r in runs}
        runs = [r for r in json.loads(out_json.read_text())["runs"]
                if r["label"] not in new_labels] + runs
    config = {k: v for k, v in vars(args).items()}
    write_json(out_json.name, dict(benchmark="serve_bench", config=config,
                                   machine=dict(start=before, end=machine_info()), runs=runs))
    plot(runs, out_json.with_suffix(".png"))
    print(f"wrote {out_json} and {out_json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
