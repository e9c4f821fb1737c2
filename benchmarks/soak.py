"""Soak: concurrent streaming clients for a fixed time, some leaving at random (seeded) moments.

Every answer that finishes must equal the answer its prompt gets alone (text equal, audio length
equal); afterwards no stage may hold per-request state (``/debug/stats``) and the object store's
used memory must be back within a margin of where it started.

    .venv/bin/python -m benchmarks.soak --minutes 10 --clients 6 --abort-rate 0.3 --seed 0

Bounded (``--minutes`` at most 24 h) and loopback only: it starts its own local Ray cluster and
the tiny app on 127.0.0.1 (``benchmarks/launch.py``) and talks to nothing else. Prints one
summary line, writes ``benchmarks/results/soak.json`` and exits 1 if a check failed. The quick
variant (about a minute, in CI) is ``tests/serve/test_soak.py``, which calls ``soak`` here.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

MAX_MINUTES = 24 * 60


@dataclass(frozen=True)
class Prompt:
    text: str
    audio: bool = True
    voice: str = "ethan"
    max_tokens: int = 12
    frames: int = 30

    def body(self) -> dict:
        b = {"model": "qwen3-omni", "messages": [{"role": "user", "content": self.text}],
             "modalities": ["text", "audio"] if self.audio else ["text"], "stream": True,
             "max_tokens": self.max_tokens, "max_audio_frames": self.frames}
        if self.audio:
            b["audio"] = {"voice": self.voice, "format": "pcm16"}
        return b


PROMPTS = (
    Prompt("Hello there, how are you?"),
    Prompt("Tell me about the weather today", voice="chelsie", max_tokens=16, frames=40),
    Prompt("What is two plus two?", voice="aiden", max_tokens=8, frames=20),
    Prompt("Sing me a short song", max_tokens=20, frames=50),
    Prompt("Summarise the news in one line", audio=False, max_tokens=24),
    Prompt("Why is the sky blue?", audio=False, max_tokens=10),
)


@dataclass
class Answer:
    status: int = 0
    text: str = ""
    samples: int = 0          # PCM16 samples received
    events: int = 0
    error: str | None = None  # HTTP error, error event or transport error
    aborted: bool = False     # the client left before the end, on purpose
    finished: bool = False    # saw the finish_reason chunk and [DONE]


def stream_once(client: httpx.Client, url: str, prompt: Prompt,
                abort_after: int | None = None) -> Answer:
    """One streamed request; leaves after ``abort_after`` events when set (closing the
    connection is the client's cancel). Never raises: failures land in ``Answer.error``."""
    ans = Answer()
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=prompt.body()) as r:
            ans.status = r.status_code
            if r.status_code != 200:
                r.read()
                ans.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return ans
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                if line == "data: [DONE]":
                    ans.finished = ans.error is None
                    break
                ev = json.loads(line[5:])
                ans.events += 1
                if "error" in ev:
                    ans.error = ev["error"]["message"]
                    continue
                delta = ev["choices"][0]["delta"] if ev.get("choices") else {}
                ans.text += delta.get("content") or ""
                audio = delta.get("audio") or {}
                if audio.get("data"):
                    ans.samples += len(base64.b64decode(audio["data"])) // 2
                if abort_after is not None and ans.events >= abort_after:
                    ans.aborted = True
                    return ans
    except httpx.HTTPError as e:
        ans.error = f"{type(e).__name__}: {e}"
    return ans


def stage_stats(url: str) -> dict:
    r = httpx.get(f"{url}/debug/stats", timeout=30)
    r.raise_for_status()
    return r.json()


def busy_stages(url: str) -> dict:
    """Stages that still hold per-request state or unacknowledged chunk refs."""
    return {k: v for k, v in stage_stats(url).items()
            if v["requests"] or v["runner_requests"] or v["senders_in_flight"] or v["held_chunks"]}


def object_store_used() -> float:
    """Bytes in use in the cluster's object stores (total minus available; no dashboard
    needed). Ray refreshes the figure about every second."""
    import ray

    return ray.cluster_resources()["object_store_memory"] - ray.available_resources()[
        "object_store_memory"]


def poll(fn, deadline_s: float, interval_s: float = 0.1):
    """``fn()`` until truthy or the deadline; returns the last value."""
    end = time.monotonic() + deadline_s
    while True:
        out = fn()
        if out or time.monotonic() > end:
            return out
        time.sleep(interval_s)


@dataclass
class SoakReport:
    seconds: float
    clients: int
    seed: int
    completed: int = 0
    aborted: int = 0
    mismatches: list = field(default_factory=list)   # answers unlike their prompt's alone answer
    errors: list = field(default_factory=list)       # requests that failed (none should)
    busy_after: dict = field(default_factory=dict)    # stages with per-request state at the end
    store_used_before: float = 0.0
    store_used_after: float = 0.0
    store_margin: float = 0.0
    clean_s: float = 0.0                              # end of load -> every stage clean

    @property
    def ok(self) -> bool:
        return (self.completed > 0 and not self.mismatches and not self.errors
                and not self.busy_after
                and self.store_used_after <= self.store_used_before + self.store_margin)

    def summary(self) -> str:
        return (f"soak {self.seconds:.0f}s x {self.clients} clients: {self.completed} completed, "
                f"{self.aborted} aborted, {len(self.mismatches)} mismatches, {len(self.errors)} "
                f"errors; clean after {self.clean_s:.2f}s; object store used "
                f"{self.store_used_before / 2**20:.2f} -> {self.store_used_after / 2**20:.2f} MiB "
                f"(margin {self.store_margin / 2**20:.1f}); {'OK' if self.ok else 'FAILED'}")


def soak(url: str, *, seconds: float, clients: int = 5, abort_rate: float = 0.3, seed: int = 0,
         prompts=PROMPTS, store_margin: float = 2 * 2**20,
         clean_deadline_s: float = 15.0) -> SoakReport:
    """Run the soak against a running app (Ray must be connected to its cluster)."""
    rep = SoakReport(seconds=seconds, clients=clients, seed=seed, store_margin=store_margin)
    with httpx.Client(timeout=120) as c:
        alone = {p: stream_once(c, url, p) for p in prompts}
    bad = {p.text: a.error for p, a in alone.items() if not a.finished}
    if bad:
        raise RuntimeError(f"alone answers failed: {bad}")
    poll(lambda: not busy_stages(url), clean_deadline_s)
    rep.store_used_before = object_store_used()
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client_loop(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(timeout=120) as c:
            while time.monotonic() < end:
                p = rng.choice(prompts)
                leave = rng.randint(1, 12) if rng.random() < abort_rate else None
                a = stream_once(c, url, p, abort_after=leave)
                with lock:
                    if a.aborted:
                        rep.aborted += 1
                    elif a.error is not None or not a.finished:
                        rep.errors.append({"prompt": p.text, "error": a.error})
                    else:
                        rep.completed += 1
                        ref = alone[p]
                        if a.text != ref.text or a.samples != ref.samples:
                            rep.mismatches.append({"prompt": p.text, "text": a.text[:80],
                                                   "alone": ref.text[:80], "samples": a.samples,
                                                   "alone_samples": ref.samples})

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 180)
        if t.is_alive():
            rep.errors.append({"error": "a client hung past the soak's end"})
    t_load_end = time.monotonic()
    poll(lambda: not busy_stages(url), clean_deadline_s, interval_s=0.05)
    rep.clean_s = time.monotonic() - t_load_end
    rep.busy_after = busy_stages(url)
    limit = rep.store_used_before + store_margin
    poll(lambda: object_store_used() <= limit, clean_deadline_s, interval_s=0.25)
    rep.store_used_after = object_store_used()
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, required=True, help=f"0 < minutes <= {MAX_MINUTES}")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--abort-rate", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/soak.json")
    args = ap.parse_args(argv)
    if not 0 < args.minutes <= MAX_MINUTES:
        ap.error(f"--minutes must be in (0, {MAX_MINUTES}]")
    if not 1 <= args.clients <= 64 or not 0 <= args.abort_rate <= 1:
        ap.error("--clients must be in [1, 64] and --abort-rate in [0, 1]")
    from benchmarks.launch import LocalServe, tiny_model_dir

    with LocalServe() as ls:
        url = ls.deploy("tiny-async", tiny_model_dir())
        rep = soak(url, seconds=args.minutes * 60, clients=args.clients,
                   abort_rate=args.abort_rate, seed=args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**asdict(rep), "ok": rep.ok}, indent=2))
    print(rep.summary())
    return 0 if rep.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
