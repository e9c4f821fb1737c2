"""HTTP helpers shared by the Serve tests: stage stats, clean-state polling, SSE clients."""

from __future__ import annotations

import base64
import json
import random
import re
import socket
import struct
import threading
import time
from urllib.parse import urlsplit

import httpx

MODEL = "qwen3-omni"


def app_args(model_dir: str, mode: str, **over) -> dict:
    """``build_omni_app`` args of a test app (debug endpoints and fault injection on)."""
    args = {
        "model": model_dir,
        "model_id": MODEL,
        "pipeline": {"mode": mode},
        "limits": {"max_prompt_tokens": 512, "default_max_audio_frames": 60},
        "security": {"enable_debug_endpoints": True, "allow_fault_injection": True},
    }
    args.update(over)
    return args


def body(text: str, *, audio: bool = True, stream: bool = True, max_tokens: int = 16,
         frames: int = 40, voice: str = "ethan") -> dict:
    b = {"model": MODEL, "messages": [{"role": "user", "content": text}],
         "modalities": ["text", "audio"] if audio else ["text"], "stream": stream,
         "max_tokens": max_tokens, "max_audio_frames": frames}
    if audio:
        b["audio"] = {"voice": voice, "format": "pcm16" if stream else "wav"}
    return b


def wait_ready(url: str, deadline_s: float = 300.0, headers: dict | None = None) -> str:
    """Poll ``/health`` until it answers 200 (every stage ready and the warm-up done: the first
    request is then as fast as the next); returns ``url``."""
    def ok():
        try:
            return httpx.get(f"{url}/health", headers=headers, timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    poll(ok, deadline_s, f"{url}/health 200", interval_s=0.2)
    return url


def stats(url: str) -> dict:
    r = httpx.get(f"{url}/debug/stats", timeout=30)
    r.raise_for_status()
    return r.json()


def busy_stages(s: dict) -> dict:
    return {k: v for k, v in s.items()
            if v["requests"] or v["runner_requests"] or v["senders_in_flight"] or v["held_chunks"]}


def wait_clean(url: str, deadline_s: float = 5.0) -> dict:
    """Poll until no stage holds per-request state or unacknowledged chunk refs; returns the
    stages still busy at the deadline ({} when clean)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            busy = busy_stages(stats(url))
        except httpx.HTTPError as e:
            busy = {"stats": str(e)}
        if not busy or time.monotonic() > end:
            return busy
        time.sleep(0.05)


def poll(fn, deadline_s: float, what: str, interval_s: float = 0.05):
    """Call ``fn`` until it returns a truthy value; fail with ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
        time.sleep(interval_s)


class SSEClient(threading.Thread):
    """One streaming chat completion on a thread: events with their arrival times.

    ``abort_after`` lines (if set) closes the connection mid-stream, the client's cancel.
    """

    def __init__(self, url: str, payload: dict, *, abort_after: int | None = None,
                 timeout_s: float = 120):
        super().__init__(daemon=True)
        self.url, self.payload = url, payload
        self.abort_after, self.timeout_s = abort_after, timeout_s
        self.status: int | None = None
        self.headers: dict = {}
        self.error_body: dict | None = None
        self.events: list[tuple[float, dict]] = []
        self.exception: BaseException | None = None
        self.aborted = False
        self.t_start = self.t_end = None

    def run(self) -> None:
        self.t_start = time.monotonic()
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=self.payload,
                              timeout=self.timeout_s) as r:
                self.status, self.headers = r.status_code, dict(r.headers)
                if r.status_code != 200:
                    r.read()
                    try:
                        self.error_body = r.json()
                    except ValueError:
                        self.error_body = {"raw": r.text}
                    return
                lines = 0
                for line in r.iter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    self.events.append((time.monotonic(), json.loads(line[5:])))
                    lines += 1
                    if self.abort_after is not None and lines >= self.abort_after:
                        self.aborted = True
                        return
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.exception = e
        finally:
            self.t_end = time.monotonic()

    # -- what came back --------------------------------------------------------------------
    @property
    def error(self) -> dict | None:
        for _, ev in self.events:
            if "error" in ev:
                return ev["error"]
        return None

    @property
    def error_time(self) -> float | None:
        return next((t for t, ev in self.events if "error" in ev), None)

    @property
    def text(self) -> str:
        return "".join(ev["choices"][0]["delta"].get("content") or ""
                       for _, ev in self.events if ev.get("choices"))

    @property
    def audio_bytes(self) -> int:
        return len(b"".join(base64.b64decode(a["data"]) for a in self._audio()))

    @property
    def audio_events(self) -> int:
        return sum(1 for a in self._audio() if a.get("data"))

    @property
    def finish_reason(self) -> str | None:
        for _, ev in self.events:
            for c in ev.get("choices", []):
                if c.get("finish_reason"):
                    return c["finish_reason"]
        return None

    def _audio(self):
        for _, ev in self.events:
            for c in ev.get("choices", []):
                a = c["delta"].get("audio")
                if a:
                    yield a


def run_alone(url: str, payload: dict) -> SSEClient:
    c = SSEClient(url, payload)
    c.run()
    assert c.status == 200 and c.exception is None and c.error is None, (c.status, c.error_body)
    return c


def raw_disconnect(url: str, payload: dict, after_s: float, reset: bool) -> None:
    """POST ``payload`` on a raw socket and close it ``after_s`` later (RST if ``reset``)."""
    u = urlsplit(url)
    data = json.dumps(payload).encode()
    head = (f"POST {u.path}/v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    try:
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(head + data)
        time.sleep(after_s)
    finally:
        s.close()


def disconnect_storm(url: str, make_body, rounds: int, per_round: int, seed: int = 10,
                     max_after_s: float = 0.5) -> int:
    """``rounds`` rounds of ``per_round`` raw-socket clients leaving after a random 0 to
    ``max_after_s`` seconds (some with a reset), plus 2 httpx streams a round closed after a
    random number of events. ``make_body(rng, label)`` makes each body. Returns the count."""
    rng = random.Random(seed)
    for r in range(rounds):
        workers: list[threading.Thread] = [
            threading.Thread(target=raw_disconnect, daemon=True,
                             args=(url, make_body(rng, f"{r}.{i}"), rng.uniform(0, max_after_s),
                                   rng.random() < 0.3))
            for i in range(per_round)]
        clients = [SSEClient(url, make_body(rng, f"{r}.c{i}"), abort_after=rng.randint(1, 12))
                   for i in range(2)]
        for t in workers + clients:
            t.start()
        for t in workers + clients:
            t.join(60)
        errors = [c.exception for c in clients if c.exception is not None]
        assert not errors, errors
    return rounds * (per_round + 2)


# -- Ray's metrics export -------------------------------------------------------------------------
def metrics_text() -> str:
    import ray

    out = []
    for node in ray.nodes():
        if node["Alive"]:
            host, port = node["NodeManagerAddress"], node["MetricsExportPort"]
            r = httpx.get(f"http://{host}:{port}/metrics", timeout=10)
            out.append(r.text)
    return "\n".join(out)


STAGE_GAUGE = re.compile(r'^ray_omni_ray_stage_(queue_depth|running_requests)\{([^}]*)\} (\S+)$',
                         re.M)


def stage_gauges(text: str) -> dict[str, float]:
    """{"queue_depth thinker WorkerId=...": value} of every stage gauge series."""
    out = {}
    for name, tags, value in STAGE_GAUGE.findall(text):
        stage = re.search(r'stage="([^"]*)"', tags).group(1)
        worker = re.search(r'WorkerId="([^"]*)"', tags)
        out[f"{name} {stage} {worker.group(1)[:8] if worker else tags[:60]}"] = float(value)
    return out
