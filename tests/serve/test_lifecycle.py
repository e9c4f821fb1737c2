"""Request lifecycle over HTTP: abort on disconnect, stage errors, bad input, handles."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

BODY = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "Tell me a long story"}],
        "modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}}


def stats(url) -> dict:
    return httpx.get(f"{url}/debug/stats", timeout=30).json()


def wait_clean(url, deadline_s=5.0) -> dict:
    """Poll until no stage holds per-request state or unacknowledged chunk refs."""
    end = time.monotonic() + deadline_s
    while True:
        s = stats(url)
        busy = {k: v for k, v in s.items()
                if v["requests"] or v["runner_requests"] or v["senders_in_flight"] or v["held_chunks"]}
        if not busy or time.monotonic() > end:
            return busy
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["async_chunk", "sync"])
def test_client_disconnect_mid_stream_leaves_nothing(serve_urls, mode):
    url = serve_urls[mode]
    body = dict(BODY, stream=True, max_tokens=200, max_audio_frames=1000)
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = 0
        for line in r.iter_lines():
            lines += line.startswith("data:")
            if lines >= 4:
                break  # leave mid-stream: closing the connection is the client's cancel
    t0 = time.monotonic()
    assert wait_clean(url, 5.0) == {}
    assert time.monotonic() - t0 < 2.0, "abort should reach every stage within about a second"
    after = stats(url)
    assert sum(v["aborts"] for v in after.values()) >= 1


def test_stage_error_ends_only_that_request(serve_urls):
    url = serve_urls["async_chunk"]
    results = {}

    def healthy():
        r = httpx.post(f"{url}/v1/chat/completions",
                       json=dict(BODY, max_tokens=24, max_audio_frames=40), timeout=120)
        results["healthy"] = r

    th = threading.Thread(target=healthy)
    th.start()
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions",
                      json=dict(BODY, stream=True, max_tokens=200, max_audio_frames=1000),
                      headers={"x-omni-fault": "talker"}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                events.append(json.loads(line[5:]))
    th.join()
    errors = [e for e in events if "error" in e]
    assert errors and "talker" in errors[0]["error"]["message"]
    assert results["healthy"].status_code == 200
    assert results["healthy"].json()["choices"][0]["message"]["audio"]["data"]
    assert wait_clean(url) == {}


@pytest.mark.parametrize("stage", ["thinker", "code2wav"])
def test_stage_error_non_streaming_is_5xx(serve_urls, stage):
    url = serve_urls["async_chunk"]
    r = httpx.post(f"{url}/v1/chat/completions", json=dict(BODY, max_tokens=200,
                                                          max_audio_frames=1000),
                   headers={"x-omni-fault": stage}, timeout=60)
    assert r.status_code == 500
    assert stage in r.json()["error"]["message"]
    assert wait_clean(url) == {}


def _wav_b64(samples: int, rate: int) -> str:
    import base64

    import numpy as np
    from media_samples import audio_bytes

    return base64.b64encode(audio_bytes(np.zeros(samples, np.float32), rate)).decode()


BAD = [
    ({"model": "nope"}, 404, "model"),
    ({"modalities": ["video"]}, 400, "modalities"),
    ({"audio": {"voice": "darth", "format": "wav"}}, 400, "audio.voice"),
    ({"audio": {"voice": "ethan", "format": "ogg"}}, 400, "audio.format"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "user", "content": ""}]}, 400, "messages.0.content"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "data:,x"}}]}]},
     400, "messages.0.content.0.image_url.url"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, 400, "messages"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 100000}, 400, "max_tokens"),
    ({"max_audio_frames": 10 ** 6}, 400, "max_audio_frames"),
    ({"n": 2}, 400, "n"),
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, 400, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, 400,
     "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "http://[::ffff:127.0.0.1]:8000/"}}]}]},
     400, "messages.0.content.0.image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": _wav_b64(200, 16000), "format": "wav"}}]}]}, 400, "messages.0.content.0.input_audio"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": _wav_b64(299, 1), "format": "wav"}}]}]}, 400, "messages.0.content.0.input_audio"),
]


@pytest.mark.parametrize("patch,status,param", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_gets_4xx_naming_the_field(serve_urls, patch, status, param):
    # json.dumps escapes non-ASCII (lone surrogates included, which httpx's json= cannot send)
    r = httpx.post(f"{serve_urls['async_chunk']}/v1/chat/completions",
                   content=json.dumps(dict(BODY, **patch)).encode(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param or err["param"].startswith(param), err
    assert err["message"] and err["type"]


def test_malformed_json_is_400(serve_urls):
    r = httpx.post(f"{serve_urls['async_chunk']}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert "error" in r.json()


def test_models_and_health(serve_urls):
    url = serve_urls["async_chunk"]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert httpx.head(f"{url}/health").status_code == 200  # load balancers probe with HEAD
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "qwen3-omni"


def test_deployment_handle_streaming(serve_urls):
    """Another Ray app calls the pipeline through a DeploymentHandle."""
    from ray import serve

    handle = serve.get_app_handle("omni-async_chunk")

    async def run():
        events = []
        gen = handle.options(stream=True).generate.remote(
            dict(BODY, max_tokens=8, max_audio_frames=20))
        async for ev in gen:
            events.append(ev)
        return events

    import asyncio

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "done" and "text" in kinds and "audio" in kinds
    audio = sum(e["num_samples"] for e in events if e["type"] == "audio")
    assert audio > 0 and (audio + 555) % 1920 == 0  # whole frames, joined exactly
    details = events[-1]["usage"]["completion_tokens_details"]
    assert details["text_tokens"] == 8 and details["audio_tokens"] == (audio + 555) // 1920
    assert events[-1]["usage"]["completion_tokens"] == 8 + details["audio_tokens"]
