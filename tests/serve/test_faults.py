"""Faults on a live app: a stage's engine process dies mid-stream, and a flood meets full queues.

Runs its own app (``omni-faults`` on ``/faults``) so the session apps stay untouched: health
checks every second, and code2wav limited to 2 ongoing + 1 queued requests so a flood of 20
requests meets Serve's backpressure (the ingress answers 503 + ``Retry-After``).
"""

from __future__ import annotations

import base64
import io
import os
import signal
import statistics
import time
import wave

import httpx
import pytest
from serve_helpers import SSEClient, app_args, body, poll, run_alone, stats, wait_clean

pytestmark = pytest.mark.slow

APP, PREFIX = "omni-faults", "/faults"
FAST_HEALTH = {"health_check_period_s": 1, "health_check_timeout_s": 10,
               "graceful_shutdown_timeout_s": 5}
TEXT_PROMPTS = ["Count slowly from one to one hundred", "Name every planet you know"]
TEXT_TOKENS = 300


def stage_cfg(stage: str, **deployment_config) -> dict:
    from omni_ray.config.serving import OmniServingArgs

    cfg = OmniServingArgs().model_dump()[stage]  # keeps the stage's default sampling
    cfg["deployment_config"] = {**FAST_HEALTH, **deployment_config}
    return cfg


@pytest.fixture(scope="module")
def fault_url(serve_base_url, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    args = app_args(tiny_model_dir, "async_chunk",
                    thinker=stage_cfg("thinker"), talker=stage_cfg("talker"),
                    code2wav=stage_cfg("code2wav", max_ongoing_requests=2, max_queued_requests=1))
    serve.run(build_omni_app(args), name=APP, route_prefix=PREFIX)
    yield f"{serve_base_url}{PREFIX}"
    serve.delete(APP)


# -- backpressure ---------------------------------------------------------------------------
def _post(url: str, payload: dict) -> dict:
    t0 = time.monotonic()
    if payload["stream"]:
        c = SSEClient(url, payload, timeout_s=60)
        c.run()
        if c.exception is not None:
            raise c.exception
        out = dict(status=c.status, headers=c.headers, error_body=c.error_body, text=c.text,
                   audio=c.audio_bytes // 2, error=c.error)
    else:
        r = httpx.post(f"{url}/v1/chat/completions", json=payload, timeout=60)
        out = dict(status=r.status_code, headers=dict(r.headers), error=None)
        try:
            js = r.json()
        except ValueError:
            js = None
        if r.status_code == 200:
            msg = js["choices"][0]["message"]
            with wave.open(io.BytesIO(base64.b64decode(msg["audio"]["data"]))) as w:
                out.update(text=msg["content"], audio=w.getnframes())
        else:
            out["error_body"] = js if js is not None else {"raw": r.text}
    out["seconds"] = time.monotonic() - t0
    return out


def test_flood_gets_503_with_retry_after_and_the_rest_correct(fault_url):
    import concurrent.futures as cf

    prompts = ["Say something nice", "Describe the sea"]
    alone = {p: run_alone(fault_url, body(p, max_tokens=8, frames=16)) for p in prompts}
    payloads = [body(prompts[i % 2], max_tokens=8, frames=16, stream=i % 4 != 3)
                for i in range(20)]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda p: _post(fault_url, p), payloads))
    wall = time.monotonic() - t0
    ok = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    # A full stage is answered by the ingress in OpenAI's schema; a full ingress by Serve's
    # proxy (plain text "Request dropped due to backpressure ...").
    stage_503 = [r for r in refused if "error" in (r["error_body"] or {})]
    proxy_503 = [r for r in refused if "raw" in (r["error_body"] or {})]
    lat = sorted(r["seconds"] for r in refused) or [0.0]
    print(f"\nflood: {len(ok)} ok, {len(stage_503)} stage 503, {len(proxy_503)} proxy 503 in "
          f"{wall:.1f}s; 503 latency median {statistics.median(lat) * 1e3:.0f} ms, "
          f"max {lat[-1] * 1e3:.0f} ms")
    for r, p in zip(results, payloads):
        if r["status"] != 200:
            continue
        ref = alone[p["messages"][0]["content"]]
        assert r["error"] is None, r["error"]
        assert r["text"] == ref.text and r["audio"] == ref.audio_bytes // 2
    assert ok and stage_503, "20 concurrent requests on 2+1 code2wav slots must meet backpressure"
    for r in refused:
        assert r["status"] == 503, r
        assert r["headers"].get("retry-after") == "1", r["headers"]
    assert len(stage_503) + len(proxy_503) == len(refused), refused
    for r in stage_503:
        err = r["error_body"]["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "overloaded"
        assert "code2wav" in err["message"]
    for r in proxy_503:
        assert "backpressure" in r["error_body"]["raw"]
    assert lat[-1] < 5.0, "a refusal must come at once, not after queueing"
    assert wait_clean(fault_url, 10) == {}


def test_full_ingress_is_503_with_retry_after_from_serve_proxy(serve_base_url):
    """When the ingress deployment itself is full, Serve's proxy answers (before our code runs):
    503, ``Retry-After`` from the ``backpressure_config`` that ``ingress_options`` sets, and a
    plain-text body. Checked on a stand-in ingress with our options and a slow handler."""
    import asyncio
    import concurrent.futures as cf

    from ray import serve

    from omni_ray.builders.app import ingress_options
    from omni_ray.config.serving import OmniServingArgs

    opts = ingress_options(OmniServingArgs(ingress_deployment_config={
        "max_ongoing_requests": 1, "max_queued_requests": 1}))
    opts["name"] = "StandInIngress"

    class StandIn:
        async def __call__(self, request) -> str:
            await asyncio.sleep(3)  # holds its only slot while the flood arrives
            return "ok"

    serve.run(serve.deployment(StandIn, **opts).bind(), name="omni-full-ingress",
              route_prefix="/full-ingress")
    try:
        with cf.ThreadPoolExecutor(6) as pool:
            resps = list(pool.map(lambda _: httpx.get(f"{serve_base_url}/full-ingress", timeout=30),
                                  range(6)))
    finally:
        serve.delete("omni-full-ingress")
    refused = [r for r in resps if r.status_code != 200]
    assert refused and any(r.status_code == 200 for r in resps)
    for r in refused:
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "backpressure" in r.text


# -- a stage's engine dies mid-stream -------------------------------------------------------
def _healthy_pid(url: str, stage: str, old_pid: int) -> int | None:
    try:
        s = stats(url)
    except httpx.HTTPError:
        return None
    return s[stage]["pid"] if s[stage]["pid"] != old_pid else None


def _health_down(url):
    r = httpx.get(f"{url}/health", timeout=10)
    return r if r.status_code != 200 else None


@pytest.mark.parametrize("stage", ["talker", "code2wav", "thinker"])
def test_dead_engine_fails_its_requests_and_is_replaced(fault_url, stage):
    url = fault_url
    alone = [run_alone(url, body(p, audio=False, max_tokens=TEXT_TOKENS)) for p in TEXT_PROMPTS]
    old_pid = stats(url)[stage]["pid"]
    audio = [SSEClient(url, body(f"Tell me a long story number {i}", max_tokens=400, frames=1200))
             for i in range(2)]
    texts = [SSEClient(url, body(p, audio=False, max_tokens=TEXT_TOKENS)) for p in TEXT_PROMPTS]
    # One audio stream at a time: this app's code2wav queues a single request (for the flood
    # test above), so two opened at the same instant could meet its backpressure (a 503).
    for c in audio:
        c.start()
        poll(lambda c=c: c.audio_events >= 1 or not c.is_alive(), 60, "an audio stream under way")
    for c in texts:
        c.start()
    try:
        poll(lambda: all(c.audio_events >= 1 for c in audio) and all(c.events for c in texts),
             60, "every stream under way")
    except AssertionError as e:
        states = [(c.status, len(c.events), c.audio_events, c.error, c.error_body, c.exception)
                  for c in audio + texts]
        raise AssertionError(f"{e}: {states}; stats {stats(url)}") from None

    # 1) Kill the engine process (a crash, not a clean exit).
    t_kill = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    for c in audio + texts:
        c.join(timeout=60)
        assert not c.is_alive(), "a request hung after its stage died"
        assert c.exception is None and c.status == 200, (c.exception, c.status)

    # 2) Requests on the dead stage end with a clear error event, promptly.
    running_at_kill = [c for c in audio + texts
                       if not any(t < t_kill and ev.get("choices") and
                                  ev["choices"][0].get("finish_reason") for t, ev in c.events)]
    bound = audio + ([c for c in texts if c in running_at_kill] if stage == "thinker" else [])
    detect = []
    for c in bound:
        assert c.error is not None, f"{stage} died but the request finished: {c.text[:80]!r}"
        assert stage in c.error["message"] and c.error["type"] == "server_error", c.error
        detect.append(c.error_time - t_kill)
    assert max(detect) < 5.0, detect

    # 3) Requests that did not use the dead stage finish with their alone answers.
    if stage != "thinker":
        for c, a in zip(texts, alone):
            assert c.error is None and c.text == a.text and c.finish_reason == a.finish_reason

    # 4) Until it is replaced, /health says which stage is down (503 + Retry-After).
    down = poll(lambda: _health_down(url), 30, "/health reporting the dead stage",
                interval_s=0.25)
    assert down.status_code == 503 and down.headers.get("retry-after"), down
    assert stage in down.json()["stages_not_ready"], down.json()

    # 5) Serve replaces the replica (failed health check); new requests succeed.
    new_pid = poll(lambda: _healthy_pid(url, stage, old_pid), 120, f"a new {stage} replica",
                   interval_s=0.25)
    t_replaced = time.monotonic() - t_kill
    after = run_alone(url, body("Are you back?", max_tokens=8, frames=16))
    assert after.text and after.audio_bytes > 0
    poll(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, 60, "/health ok")
    t_serving = time.monotonic() - t_kill
    print(f"\n{stage}: errors {min(detect) * 1e3:.0f}-{max(detect) * 1e3:.0f} ms after the kill "
          f"({sorted({c.error['message'].split(': ', 1)[1] for c in bound})}); new engine pid "
          f"{new_pid} after {t_replaced:.1f}s; serving again after {t_serving:.1f}s")
    assert wait_clean(url, 10) == {}
