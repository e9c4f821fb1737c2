"""Batch throughput on the same prompts: Ray Data (``omni_ray.data``, actors per stage), the
offline ``Omni`` (one process, all requests together) and the Serve app (closed loop, every
request in flight at once). Rows/s and audio seconds per second, end to end; the Ray Data and
Serve figures include their engines' start (``start_s``: a one-row job / the app's deploy).

    .venv/bin/python -m benchmarks.batch_bench --num-prompts 48 --max-tokens 16 --frames 40
-> ``results/batch_cpu.json``.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.launch import LocalServe, tiny_model_dir
from benchmarks.machine import machine_info, write_json
from benchmarks.serve_bench import make_prompts


def offline(model: str, prompts: list[str], a) -> dict:
    from omni_ray.offline import Omni

    t = time.perf_counter()
    omni = Omni(model, mode="sync")
    start = time.perf_counter() - t
    reqs = [omni.request([{"role": "user", "content": p}], f"o{i}", max_tokens=a.max_tokens,
                         max_audio_frames=a.frames) for i, p in enumerate(prompts)]
    t = time.perf_counter()
    outs = omni.generate(reqs)
    wall = time.perf_counter() - t
    audio = sum(o.audio.numel() for o in outs) / 24000
    return dict(start_s=start, wall_s=wall, rows=len(outs), audio_s=audio)


def data(model: str, prompts: list[str], a, talker_actors: int) -> dict:
    """One Ray Data job over ``prompts`` (its actors start with it). Besides the job's wall:
    the steady rate, rows after the first output block over the time from the first block to
    the last (blocks are ``batch_size`` rows), and each stage's busy time (every batch's
    wall once, from the rows' ``<stage>_batch_s``; actors of a stage work side by side)."""
    import ray

    from omni_ray.data import DataStageConfig, OmniProcessorConfig, build_omni_processor

    cfg = OmniProcessorConfig(model=model, default_max_tokens=a.max_tokens,
                              default_max_audio_frames=a.frames, audio_format="float32",
                              thinker=DataStageConfig(batch_size=a.batch_size),
                              talker=DataStageConfig(batch_size=a.batch_size,
                                                     concurrency=talker_actors),
                              code2wav=DataStageConfig(batch_size=a.batch_size))
    proc = build_omni_processor(cfg)
    t = time.perf_counter()
    proc(ray.data.from_items([{"id": "w", "prompt": "Hi"}])).take_all()  # engines' start alone
    start = time.perf_counter() - t
    rows = [{"id": f"d{i}", "prompt": p} for i, p in enumerate(prompts)]
    ds = proc(ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // a.batch_size)))
    t, arrivals, out = time.perf_counter(), [], []
    for batch in ds.iter_batches(batch_size=None, batch_format="pandas"):
        arrivals.append((time.perf_counter() - t, len(batch)))
        out += batch.drop(columns=["audio"]).to_dict("records")
    wall = time.perf_counter() - t
    assert all(r["error"] is None for r in out), [r["error"] for r in out if r["error"]]
    busy = {s: sum({r[f"{s}_batch_s"] for r in out} - {None}) / (talker_actors if s == "talker"
                                                                  else 1)
            for s in ("thinker", "talker", "code2wav")}
    span = arrivals[-1][0] - arrivals[0][0]
    audio = sum(r["audio_seconds"] for r in out)
    steady = sum(n for _, n in arrivals[1:]) / span if span > 0 else None
    return dict(start_s=start, wall_s=wall, rows=len(out), talker_actors=talker_actors,
                audio_s=audio, first_block_s=arrivals[0][0], blocks=len(arrivals),
                steady_rows_per_s=steady,
                steady_audio_s_per_s=None if steady is None else steady * audio / len(out),
                stage_busy_s=busy,
                note="wall_s includes the actors' engine start (start_s: a one-row job alone); "
                     "steady_*: from the first output block to the last")


def serve(ls: LocalServe, model: str, prompts: list[str], a) -> dict:
    from benchmarks.serve_bench import bench

    t = time.perf_counter()
    url = ls.deploy("tiny-sync", model)
    start = time.perf_counter() - t
    run = bench(url, "tiny-sync", concurrency=str(len(prompts)), num_requests=len(prompts),
                max_tokens=a.max_tokens, max_audio_frames=a.frames, warmup=1)[0]["summary"]
    ls.undeploy("tiny-sync")
    return dict(start_s=start, wall_s=run["wall_s"], rows=run["num_ok"],
                audio_s=run["audio_seconds_per_s"] * run["wall_s"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--talker-actors", type=int, nargs="+", default=[1, 2],
                    help="the talker's actor counts to run (the other stages keep one)")
    ap.add_argument("--out", default="batch_cpu")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = tiny_model_dir()
    prompts = make_prompts("fixed", a.num_prompts, 0, 0)
    res = dict(benchmark="batch", config=vars(a), machine=dict(start=machine_info()), setups={})
    res["setups"]["offline"] = offline(model, prompts, a)
    with LocalServe() as ls:
        for n in a.talker_actors:
            res["setups"][f"ray-data-talker{n}"] = data(model, prompts, a, n)
        res["setups"]["serve"] = serve(ls, model, prompts, a)
    for s in res["setups"].values():
        s["rows_per_s"] = s["rows"] / s["wall_s"]
        s["audio_s_per_s"] = s["audio_s"] / s["wall_s"]
    res["machine"]["end"] = machine_info()
    print(write_json(f"{a.out}.json", res))
    for k, s in res["setups"].items():
        steady = ("" if s.get("steady_rows_per_s") is None else
                  f"  steady rows/s {s['steady_rows_per_s']:.2f}")
        print(f"{k:20s} rows/s {s['rows_per_s']:.2f}  audio s/s {s['audio_s_per_s']:.2f}  "
              f"wall {s['wall_s']:.1f}s  start {s['start_s']:.1f}s{steady}")


if __name__ == "__main__":
    main()
