"""Shared by the disaggregated-thinker Serve tests (test_kv_disagg*.py): the app's args, the
non-disaggregated reference answers, one answer over HTTP, and polling until nothing is held."""

from __future__ import annotations

import base64
import io
import time
import wave

import httpx
import numpy as np
from serve_helpers import wait_ready

APP, PREFIX, REF_PREFIX, MODEL = "omni-kv", "/kv", "/kv-ref", "qwen3-omni"
PROMPT = "Hello there, how are you?"
TIMEOUTS = {"prefill_s": 20.0, "transfer_s": 3.0, "load_s": 10.0}
STATES = ["REQUESTED", "HELD", "EXTRACTED", "TRANSFERRED", "LOADED", "RELEASED"]
# Which state each failure happens in (the transfer's ``failed_at``).
FAILURES = {"prefill_dies": "HELD", "extract_fails": "HELD", "transfer_timeout": "EXTRACTED",
            "load_fails": "TRANSFERRED"}
BUSY_KEYS = ("requests", "runner_requests", "senders_in_flight", "held_chunks", "kv_held",
             "kv_waiting", "kv_refs_owned", "kv_transfers_live", "kv_refs_held",
             "kv_streams_draining")


def kv_args(model_dir: str, **over) -> dict:
    return {"model": model_dir, "model_id": MODEL, "pipeline": {"mode": "async_chunk"},
            "limits": {"max_prompt_tokens": 512, "default_max_audio_frames": 60},
            "security": {"enable_debug_endpoints": True, "allow_fault_injection": True}, **over}


def reference_answers(serve_port: int, tiny_model_dir: str) -> dict:
    """Non-disaggregated answers from the same app without ``thinker_disaggregation`` (deleted
    before the disaggregated one starts: one set of engines at a time on a small machine)."""
    from ray import serve

    from omni_ray import build_omni_app

    serve.run(build_omni_app(kv_args(tiny_model_dir)), name=f"{APP}-ref", route_prefix=REF_PREFIX)
    url = wait_ready(f"http://127.0.0.1:{serve_port}{REF_PREFIX}")
    try:
        return {(m, stream): ask(url, m, stream)
                for m in (("text", "audio"), ("text",)) for stream in (False, True)}
    finally:
        serve.delete(f"{APP}-ref")


def body(modalities=("text", "audio"), stream=False) -> dict:
    b = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
         "modalities": list(modalities), "max_tokens": 16, "max_audio_frames": 40,
         "stream": stream}
    if "audio" in modalities:
        b["audio"] = {"voice": "chelsie", "format": "pcm16" if stream else "wav"}
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def ask(url, modalities=("text", "audio"), stream=False, fault=None):
    """(text, pcm16 array or None, completion_tokens) of one answer; asserts 200."""
    headers = {"x-omni-kv-fault": fault} if fault else {}
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body(modalities), headers=headers,
                       timeout=120)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        pcm = None
        if msg.get("audio"):
            with wave.open(io.BytesIO(base64.b64decode(msg["audio"]["data"]))) as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return msg["content"], pcm, r.json()["usage"]["completion_tokens"]
    import json

    text, pcm, usage = [], [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body(modalities, True),
                      headers=headers, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            assert "error" not in ev, ev
            usage = ev.get("usage") or usage
            for ch in ev.get("choices", []):
                d = ch["delta"]
                text.append(d.get("content") or "")
                if d.get("audio", {}).get("data"):
                    pcm.append(np.frombuffer(base64.b64decode(d["audio"]["data"]), dtype="<i2"))
    return "".join(text), (np.concatenate(pcm) if pcm else None), usage["completion_tokens"]


def same_answer(got, want):
    assert got[0] == want[0] and got[2] == want[2]
    if want[1] is None:
        assert got[1] is None
    else:
        assert got[1] is not None and np.array_equal(got[1], want[1])


def stats(url) -> dict:
    r = httpx.get(f"{url}/debug/stats", timeout=30)
    r.raise_for_status()
    return r.json()


def wait_clean(url, deadline_s=10.0) -> dict:
    """Poll until nothing anywhere holds per-request state, KV or refs; returns what is busy."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            busy = {f"{stage}.{k}": v for stage, s in stats(url).items() for k, v in s.items()
                    if k in BUSY_KEYS and v}
        except httpx.HTTPError as e:  # a replaced replica may answer errors for a moment
            busy = {"stats": repr(e)}
        if not busy or time.monotonic() > end:
            return busy
        time.sleep(0.1)


def kv_counts(url, deadline_s=120.0) -> dict:
    """The ingress's KV counters (retried while a replaced replica makes /debug/stats fail)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return {k: v for k, v in stats(url)["kv_ingress"].items() if k.startswith("kv_")}
        except httpx.HTTPError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def wait_prefill_healthy(url, deadline_s=120.0) -> None:
    """After a killed prefill engine: until a request hands off through prefill again."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        before = kv_counts(url)
        r = httpx.post(f"{url}/v1/chat/completions", json=body(("text",)), timeout=60)
        if r.status_code == 200 and kv_counts(url)["kv_released"] == before["kv_released"] + 1:
            return
        time.sleep(1.0)
    raise AssertionError("the prefill deployment did not recover")
