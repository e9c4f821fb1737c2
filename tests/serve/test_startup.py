"""Start-up of a real app: ``/health`` answers at once from the moment the ingress runs (503 +
``Retry-After`` naming what is not ready, never a hang), turns 200 only after every stage's engine
has served the ingress's warm-up requests (ingress/warmup.py), read from ``/debug/stats`` before
any user request. Real Ray, real Serve, real HTTP, the tiny checkpoint.

A request sent before the ingress replica runs is held by Serve's proxy until it does (or answered
404 before the route exists): outside the app; its wait is reported, not bounded."""

from __future__ import annotations

import time

import httpx
import pytest
from serve_helpers import app_args, body, run_alone, stats

pytestmark = pytest.mark.slow

APP, PREFIX = "omni-startup", "/startup"
HEALTH_ANSWER_BOUND_S = 5.0  # "answers quickly": readiness calls time out after 2 s


def _watch_health(url: str, deadline_s: float) -> list[tuple]:
    """GET /health every 0.1 s until 200: (status, seconds the answer took, body)."""
    seen, end = [], time.monotonic() + deadline_s
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            r = httpx.get(f"{url}/health", timeout=30)
            status, js = r.status_code, _json(r)
            retry = r.headers.get("retry-after")
        except httpx.HTTPError as e:
            status, js, retry = None, repr(e), None
        seen.append((status, time.monotonic() - t0, js, retry))
        if status == 200:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"/health not 200 after {deadline_s}s: {seen[-3:]}")


def _json(r: httpx.Response):
    try:
        return r.json()
    except ValueError:
        return r.text


def test_health_answers_during_start_up_and_is_200_only_after_warm_up(serve_base_url,
                                                                      tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    url = f"{serve_base_url}{PREFIX}"
    serve._run(build_omni_app(app_args(tiny_model_dir, "async_chunk")), name=APP,
               route_prefix=PREFIX, _blocking=False)
    try:
        seen = _watch_health(url, 600)
        # Before any user request: every stage's engine served the warm-up requests (text+audio
        # out; the second one with an audio input, since the tiny checkpoint has a processor).
        warm = {stage: s["warmups"] for stage, s in stats(url).items()}
        first = run_alone(url, body("Hello after start-up", max_tokens=8, frames=16))
        assert first.error is None and first.text and first.audio_bytes > 0
        head = httpx.head(f"{url}/health", timeout=10)
    finally:
        serve.delete(APP)

    # Before the ingress runs, Serve's proxy holds a request (it may time out: None) or has no
    # route (404); from the ingress's first answer on, every answer must come quickly.
    i0 = next(i for i, (s, *_) in enumerate(seen) if s not in (None, 404))
    held, seen = seen[:i0 + 1], seen[i0:]
    statuses = [s for s, *_ in seen]
    slowest = max((t for _, t, _, _ in seen[1:]), default=0.0)
    unavailable = [js for s, _, js, _ in seen if s == 503]
    print(f"\nstart-up: {len(seen)} /health answers, statuses {sorted(set(statuses), key=str)}; "
          f"{len(held)} before the ingress ran took {sum(t for _, t, _, _ in held):.1f}s, the "
          f"slowest after it {slowest:.2f}s; 503 bodies seen: {_kinds(unavailable)}; "
          f"warm-ups {warm}")
    assert warm == {"thinker": 2, "talker": 2, "code2wav": 2}, warm
    assert statuses[-1] == 200 and head.status_code == 200
    assert set(statuses) <= {503, 200}, statuses  # once the ingress answers, it answers
    assert slowest <= HEALTH_ANSWER_BOUND_S, [(s, t) for s, t, _, _ in seen if t > 1]
    assert unavailable, "the app was never seen warming up or starting"
    for s, _, js, retry in seen:
        if s == 503:
            assert retry == "1" and js["status"] in ("unavailable", "warming_up"), js
            assert js["stages_not_ready"] or js["warm_up"] != "done", js
    assert any(js["status"] == "warming_up" for js in unavailable), _kinds(unavailable)


def _kinds(bodies: list) -> list:
    """The distinct 503 bodies, shortened."""
    out = []
    for js in bodies:
        k = (js["status"], tuple(sorted(js["stages_not_ready"].items())), js["warm_up"])
        if k not in out:
            out.append(k)
    return out
