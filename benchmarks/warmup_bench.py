"""First vs second request after start-up: does the first user request pay a warm-up?

``serve run`` on the tiny checkpoint (every stage on CPU, a fresh local Ray cluster), wait for
``/health`` 200, then send, one at a time: a text request twice, then an audio-input request
twice (both text+audio out, streamed). Reports time to first token of each and the ratio
first/second per kind. ``--repo`` serves another checkout (e.g. the tree before warm-up), so
before/after run the same script.

    python -m benchmarks.warmup_bench --model-dir /path/to/tiny --tag after
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks import serve_proc
from benchmarks.client import chat_body, make_client, spoken_question, stream_chat

RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(model_dir: str, port: int) -> dict:
    return {"http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": "omni", "route_prefix": "/",
                              "import_path": "omni_ray:build_omni_app",
                              "args": {"model": model_dir, "model_id": "qwen3-omni",
                                       "pipeline": {"mode": "async_chunk"}}}]}


async def measure(url: str) -> dict:
    kinds = {"text": None, "audio_input": spoken_question(1.0)}
    out = {}
    async with make_client(1) as client:
        for kind, audio in kinds.items():
            ttft = []
            for _ in range(2):
                body = chat_body("Say something nice", model="qwen3-omni", max_tokens=8,
                                 max_audio_frames=16, modalities=["text", "audio"],
                                 audio_input=audio)
                rec = await stream_chat(client, url, body)
                if rec.error or rec.first_text is None:
                    raise RuntimeError(f"{kind}: {rec.error or 'no text'}")
                ttft.append(rec.first_text - rec.start)
            out[kind] = {"first_ttft_s": ttft[0], "second_ttft_s": ttft[1],
                         "ratio": ttft[0] / ttft[1]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--repo", default=str(serve_proc.REPO_ROOT), help="checkout to serve")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--timeout-s", type=float, default=600)
    a = ap.parse_args()
    serve_proc.REPO_ROOT = Path(a.repo).resolve()  # serve run's cwd and PYTHONPATH
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "warmup.yaml"
        cfg.write_text(yaml.safe_dump(config(a.model_dir, port)))
        with serve_proc.ServeRun(cfg, Path(tmp) / "serve.log") as run:
            healthy_s = run.wait_healthy(url, a.timeout_s)
            t0 = time.perf_counter()
            res = asyncio.run(measure(url))
            res.update(tag=a.tag, repo=str(serve_proc.REPO_ROOT), healthy_after_s=healthy_s,
                       measured_s=time.perf_counter() - t0)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"warmup_{a.tag}.json").write_text(json.dumps(res, indent=2))
    print(f"warmup[{a.tag}]: healthy after {healthy_s:.1f}s; first/second TTFT text "
          f"{res['text']['first_ttft_s']:.2f}/{res['text']['second_ttft_s']:.2f}s "
          f"(x{res['text']['ratio']:.1f}), audio input {res['audio_input']['first_ttft_s']:.2f}/"
          f"{res['audio_input']['second_ttft_s']:.2f}s (x{res['audio_input']['ratio']:.1f})")


if __name__ == "__main__":
    main()
