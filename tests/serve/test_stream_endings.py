"""Every event stream ends with ``[DONE]`` (or an error event, then ``[DONE]``): issue 18, item 8.

Hundreds of streamed requests over real HTTP, plain and fuzzed (random sampling fields, voices,
modalities, usage option, odd text), several at a time, through httpx and through a requests
session (schemathesis' client). No retry: a single stream cut short fails the test. The fuzz test
(test_fuzz.py) makes the same check on schemathesis' cases.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import requests
from serve_helpers import MODEL, body, wait_clean

pytestmark = pytest.mark.slow

N_PLAIN = 160
N_FUZZED = 160
PARALLEL = 6
TEXTS = ["Hi", "Tell me a story", "a" * 300, "¿Qué tal? 你好 🙂", " ", "\n\n", "1 2 3 4 5 6 7 8",
         "\u0000x", "x\ty"]


def fuzzed_body(rng: random.Random) -> dict:
    """A streamed chat body with random (mostly valid) optional fields."""
    modalities = rng.choice([["text"], ["text", "audio"], ["audio", "text"], ["audio"]])
    b = {"model": MODEL, "stream": True, "modalities": modalities,
         "messages": [{"role": rng.choice(["user", "user", "system"]), "content": "Be brief."},
                      {"role": "user", "content": rng.choice(TEXTS)}][rng.randint(0, 1):],
         "max_tokens": rng.randint(1, 12), "max_audio_frames": rng.randint(1, 24)}
    if "audio" in modalities:
        b["audio"] = {"voice": rng.choice(["ethan", "chelsie", "Ethan"]),
                      "format": rng.choice(["pcm16", "wav"])}
    for key, gen in (("temperature", lambda: rng.choice([0.0, 0.5, 1.0, 1.7, 1e-6])),
                     ("top_p", lambda: rng.choice([0.1, 0.9, 1.0])),
                     ("seed", lambda: rng.randint(-2 ** 31, 2 ** 31)),
                     ("stream_options", lambda: {"include_usage": rng.random() < 0.5}),
                     ("max_completion_tokens", lambda: rng.randint(1, 8))):
        if rng.random() < 0.4:
            b[key] = gen()
    return b


def ending(status: int, ctype: str, text: str) -> str:
    """"done", "error" (an error event, then [DONE]), "refused" (a 4xx) or "CUT"."""
    if status != 200:
        return "refused" if 400 <= status < 500 else f"HTTP {status}"
    assert ctype.startswith("text/event-stream"), ctype
    events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        return "CUT"
    parsed = [json.loads(e) for e in events[:-1]]
    if any("error" in e for e in parsed):
        return "error"
    finish = [c["finish_reason"] for e in parsed for c in e.get("choices", [])
              if c.get("finish_reason")]
    return "done" if finish else "CUT"


def send_httpx(url: str, payload: dict) -> str:
    with httpx.Client(timeout=120) as c:
        r = c.post(f"{url}/v1/chat/completions", json=payload)
        return ending(r.status_code, r.headers.get("content-type", ""), r.text)


def send_requests(session: requests.Session, url: str, payload: dict) -> str:
    r = session.post(f"{url}/v1/chat/completions", data=json.dumps(payload),
                     headers={"content-type": "application/json"}, timeout=120)
    return ending(r.status_code, r.headers.get("content-type", ""), r.text)


def run_all(url: str, payloads: list[dict]) -> dict[str, int]:
    sessions = [requests.Session() for _ in range(PARALLEL)]

    def one(i: int) -> tuple[str, str]:
        p = payloads[i]
        out = send_httpx(url, p) if i % 2 else send_requests(sessions[i % PARALLEL], url, p)
        return out, json.dumps(p)[:300]

    counts: dict[str, int] = {}
    cut = []
    with ThreadPoolExecutor(PARALLEL) as pool:
        for out, what in pool.map(one, range(len(payloads))):
            counts[out] = counts.get(out, 0) + 1
            if out not in ("done", "error", "refused"):
                cut.append((out, what))
    assert not cut, f"{len(cut)} streams did not end properly: {cut[:5]} (all: {counts})"
    return counts


def test_plain_streams_all_end_with_done(serve_urls):
    url = serve_urls["async_chunk"]
    payloads = [dict(body(f"Stream {i}", audio=i % 3 != 0, max_tokens=6 + i % 5,
                          frames=8 + i % 9), stream_options={"include_usage": i % 2 == 0})
                for i in range(N_PLAIN)]
    counts = run_all(url, payloads)
    print(f"\nplain streams: {counts}")
    assert counts == {"done": N_PLAIN}, counts
    assert wait_clean(url, 10) == {}


def test_fuzzed_streams_all_end_with_done_or_error(serve_urls):
    url = serve_urls["async_chunk"]
    rng = random.Random(18)
    counts = run_all(url, [fuzzed_body(rng) for _ in range(N_FUZZED)])
    print(f"\nfuzzed streams: {counts}")
    # Many fuzzed bodies are refused (wav while streaming, audio-only answers); enough must
    # still stream for the check to mean something.
    assert counts.get("done", 0) >= N_FUZZED // 4, counts
    assert wait_clean(url, 10) == {}
