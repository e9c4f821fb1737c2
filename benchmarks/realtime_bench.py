"""Realtime latency: end of the user's speech -> first answer audio over ``WS /v1/realtime``.

N sockets at once (``--concurrency 1,8,32``), each a voice agent's user: it streams a spoken
question (espeak-ng, 24 kHz pcm16) in ``--packet-ms`` packets paced in real time, the server's
VAD ends the turn after its silence, the answer streams back; ``--turns`` questions per socket
(the conversation grows). Per turn: ``latency`` = first ``response.output_audio.delta`` minus
the moment the last packet holding speech was sent (so the VAD's silence wait is included),
``vad_delay`` = ``speech_stopped`` arrival minus that moment.

Against the tiny checkpoint on CPU (starts its own Ray and Serve)::

    python -m benchmarks.realtime_bench --start tiny-async --concurrency 1,8,32

On a GPU machine, the one-GPU yaml on a real-size stand-in (made here, random weights)::

    python -m benchmarks.realtime_bench --standin --out realtime_gpu

Against a running app, or one started here from a Serve config::

    python -m benchmarks.realtime_bench --url http://127.0.0.1:8000 --out realtime_x
    python -m benchmarks.realtime_bench --serve-config my.yaml --url http://127.0.0.1:8000

Writes ``benchmarks/results/<out>.json`` and prints one line per concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.machine import RESULTS_DIR, machine_info, write_json

RATE = 24000
QUESTIONS = ["What is the weather like today?", "Tell me a joke about cats.",
             "How far away is the moon?", "Can you recommend a good book?"]


def spoken(text: str, lead_s: float = 0.3, tail_s: float = 1.5) -> tuple[np.ndarray, int]:
    """(pcm16 at 24 kHz: silence, ``text`` by espeak-ng, silence; the sample where speech ends)."""
    import soundfile as sf
    import soxr

    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is needed (scripts/install.sh installs Debian's)")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "q.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        x, sr = sf.read(path, dtype="float32")
    pcm = np.round(soxr.resample(x, sr, RATE) * 32767).astype("<i2")
    voiced = np.flatnonzero(np.abs(pcm) > 300)
    lead = int(lead_s * RATE)
    out = np.concatenate([np.zeros(lead, "<i2"), pcm, np.zeros(int(tail_s * RATE), "<i2")])
    return out, lead + int(voiced[-1]) + 1


async def one_socket(ws_url: str, model: str, key: str | None, questions: list, args,
                     start_delay: float) -> list[dict]:
    import websockets

    await asyncio.sleep(start_delay)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out = []
    async with websockets.connect(f"{ws_url}/v1/realtime?model={model}", max_size=None,
                                  additional_headers=headers, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": args.max_output_tokens,
            "audio": {"input": {"turn_detection": {
                "type": "server_vad", "silence_duration_ms": args.silence_ms}},
                "output": {"voice": "ethan"}}}}))
        for pcm, speech_end in questions:
            marks: dict = {}
            step = RATE * args.packet_ms // 1000

            async def sender():
                t0 = time.monotonic()
                for i, a in enumerate(range(0, pcm.size, step)):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio":
                                              base64.b64encode(pcm[a:a + step].tobytes()).decode()}))
                    if a + step >= speech_end and "speech_end" not in marks:
                        marks["speech_end"] = time.monotonic()
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * args.packet_ms / 1000
                                            - time.monotonic()))

            send_task = asyncio.create_task(sender())
            try:
                while True:
                    ev = json.loads(await asyncio.wait_for(ws.recv(), args.timeout_s))
                    now, kind = time.monotonic(), ev["type"]
                    if kind == "input_audio_buffer.speech_stopped":
                        marks.setdefault("stopped", now)
                    elif kind == "response.output_audio.delta":
                        marks.setdefault("first_audio", now)
                    elif kind == "error":
                        marks["error"] = ev["error"]["message"]
                    elif kind == "response.done":
                        marks["status"] = ev["response"]["status"]
                        break
            finally:
                await send_task
            end = marks.get("speech_end")
            rec = {"status": marks.get("status"), "error": marks.get("error")}
            if end is not None and "first_audio" in marks:
                rec["latency_s"] = marks["first_audio"] - end
            if end is not None and "stopped" in marks:
                rec["vad_delay_s"] = marks["stopped"] - end
            out.append(rec)
    return out


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


async def run_level(ws_url: str, model: str, key: str | None, n: int, questions, args) -> dict:
    rng = random.Random(n)
    t0 = time.monotonic()
    per_socket = await asyncio.gather(*(
        one_socket(ws_url, model, key, [questions[(i + k) % len(questions)]
                                        for k in range(args.turns)], args,
                   rng.uniform(0, args.stagger_s)) for i in range(n)),
        return_exceptions=True)
    recs = [r for s in per_socket if not isinstance(s, BaseException) for r in s]
    failed = [repr(s)[:200] for s in per_socket if isinstance(s, BaseException)]
    lat = [r["latency_s"] for r in recs if "latency_s" in r]
    vad = [r["vad_delay_s"] for r in recs if "vad_delay_s" in r]
    return {"concurrency": n, "turns": len(recs), "answered": len(lat),
            "socket_errors": failed, "wall_s": round(time.monotonic() - t0, 2),
            "latency_p50_s": pct(lat, 50), "latency_p90_s": pct(lat, 90),
            "latency_mean_s": float(np.mean(lat)) if lat else None,
            "latency_max_s": max(lat) if lat else None,
            "vad_delay_p50_s": pct(vad, 50),
            "statuses": sorted({str(r["status"]) for r in recs})}


def bench_standin(args, bench) -> None:
    """The one-GPU yaml on a real-size stand-in (random weights, made here in seconds), started
    with ``serve run`` as benchmarks/gpu_check.py does; ``bench(url)`` against it."""
    import tempfile

    import yaml

    from benchmarks.gpu_check import BASE_CONFIG, make_checkpoint, with_overrides, write_config
    from benchmarks.serve_proc import ServeRun

    tmp = Path(tempfile.mkdtemp(prefix="realtime-standin-"))
    model, _ = make_checkpoint("dummy", tmp / "standin", args.standin_shape)
    cfg = with_overrides(yaml.safe_load(BASE_CONFIG.read_text()), {
        "model": model, "allow_dummy_weights": True,
        "limits.default_max_audio_frames": args.max_audio_frames})
    port = cfg.get("http_options", {}).get("port", 8000)
    url = f"http://127.0.0.1:{port}"
    with ServeRun(write_config(cfg, tmp / "standin.yaml"),
                  RESULTS_DIR / f"{args.out}_serve_log.txt") as run:
        run.wait_healthy(url, 1800)
        bench(url)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--start", default="", help="a setup of benchmarks/launch.py to start "
                    "locally (tiny-async); overrides --url")
    ap.add_argument("--serve-config", default="", help="a Serve yaml to `serve run` here (e.g. "
                    "the one-GPU stand-in); then --url is where it listens")
    ap.add_argument("--standin", action="store_true", help="on a GPU machine: serve "
                    "serve_configs/qwen3_omni_1gpu.yaml on a real-size stand-in and measure it "
                    "(use with --out realtime_gpu)")
    ap.add_argument("--standin-shape", default="qwen3-omni-30b-a3b")
    ap.add_argument("--model-id", default="qwen3-omni")
    ap.add_argument("--api-key-env", default="", help="env var holding the API key, if any")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--turns", type=int, default=2, help="questions per socket")
    ap.add_argument("--packet-ms", type=int, default=40)
    ap.add_argument("--silence-ms", type=int, default=500, help="server_vad silence_duration_ms")
    ap.add_argument("--max-output-tokens", type=int, default=16)
    ap.add_argument("--max-audio-frames", type=int, default=50, help="with --start: the app's "
                    "limits.default_max_audio_frames (80 ms frames an answer may speak)")
    ap.add_argument("--stagger-s", type=float, default=1.0, help="sockets start within this")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--out", default="realtime_cpu", help="results/<out>.json")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = parse_args(argv)
    questions = [spoken(q) for q in QUESTIONS]
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    before = machine_info()
    levels = [int(x) for x in args.concurrency.split(",") if x]
    runs = []

    def bench(url: str) -> None:
        ws_url = url.replace("http://", "ws://").replace("https://", "wss://")
        asyncio.run(run_level(ws_url, args.model_id, key, 1, questions, args))  # warm-up
        for n in levels:
            r = asyncio.run(run_level(ws_url, args.model_id, key, n, questions, args))
            runs.append(r)
            f = (lambda v: "-" if v is None else f"{v:.3f}")
            print(f"realtime c={n}: end of speech -> first audio p50 {f(r['latency_p50_s'])} s "
                  f"p90 {f(r['latency_p90_s'])} s (vad {f(r['vad_delay_p50_s'])} s), "
                  f"{r['answered']}/{r['turns']} turns answered, {len(r['socket_errors'])} "
                  f"socket errors, {r['wall_s']} s", flush=True)

    if args.start:
        from benchmarks.launch import LocalServe, tiny_model_dir

        from ray import serve

        from benchmarks.launch import app_args
        from omni_ray import build_omni_app

        with LocalServe() as ls:
            # A realtime answer has no per-request frame bound: the app's default is set here,
            # as the chat benchmarks' --max-audio-frames.
            app = app_args(args.start, tiny_model_dir())
            app["limits"] = {"default_max_audio_frames": args.max_audio_frames}
            serve.run(build_omni_app(app), name=args.start, route_prefix=f"/{args.start}")
            bench(f"http://127.0.0.1:{ls.port}/{args.start}")
    elif args.standin:
        bench_standin(args, bench)
    elif args.serve_config:
        from benchmarks.serve_proc import ServeRun

        log = RESULTS_DIR / f"{args.out}_serve_log.txt"
        with ServeRun(Path(args.serve_config), log) as s:
            s.wait_healthy(args.url.rstrip("/"), 1800)
            bench(args.url.rstrip("/"))
    else:
        bench(args.url.rstrip("/"))
    out = write_json(f"{args.out}.json", dict(
        benchmark="realtime_bench", config=vars(args),
        machine=dict(start=before, end=machine_info()), runs=runs))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
