"""omni_ray's Prometheus metrics reach Ray's metrics export endpoint (no dashboard needed).

Ray exports every metric of every worker on each node's ``MetricsExportPort`` with a ``ray_``
prefix, a few seconds after it is recorded; the test polls until the names appear.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from serve_helpers import SSEClient, body, metrics_text, poll, stage_gauges

pytestmark = pytest.mark.slow

EXPECTED = [
    # ingress (ray.serve.metrics)
    r'ray_omni_ray_requests_total\{[^}]*modality="audio\+text"[^}]*status="ok"',
    r'ray_omni_ray_requests_total\{[^}]*status="invalid"',
    r'ray_omni_ray_request_errors_total\{[^}]*cause="invalid_request"',
    r'ray_omni_ray_request_aborts_total\{[^}]*cause="client_disconnect"',
    r"ray_omni_ray_time_to_first_token_seconds_bucket\{",
    r"ray_omni_ray_time_to_first_audio_seconds_bucket\{",
    # engine actors (ray.util.metrics)
    r'ray_omni_ray_stage_batch_size_bucket\{[^}]*stage="thinker"',
    r'ray_omni_ray_stage_batch_size_bucket\{[^}]*stage="code2wav"',
    r'ray_omni_ray_stage_queue_depth\{[^}]*stage="talker"',
    r'ray_omni_ray_stage_running_requests\{[^}]*stage="thinker"',
    r'ray_omni_ray_chunk_latency_seconds_bucket\{[^}]*edge="thinker->talker"',
    r'ray_omni_ray_chunk_latency_seconds_bucket\{[^}]*edge="talker->code2wav"',
    r'ray_omni_ray_chunk_bytes_total\{[^}]*edge="talker->code2wav"',
    r'ray_omni_ray_chunks_total\{[^}]*edge="thinker->talker"',
]


def test_metrics_on_ray_export_endpoint(serve_urls):
    url = serve_urls["async_chunk"]
    ok = SSEClient(url, body("Metrics please", max_tokens=8, frames=30))
    ok.run()
    assert ok.status == 200 and ok.error is None and ok.audio_bytes
    bad = httpx.post(f"{url}/v1/chat/completions", json=dict(body("x"), max_tokens=10 ** 6))
    assert bad.status_code == 400
    left = SSEClient(url, body("Leave early", max_tokens=200, frames=600), abort_after=3)
    left.run()
    assert left.aborted

    t0 = time.monotonic()
    missing = EXPECTED

    def all_there():
        nonlocal missing
        text = metrics_text()
        missing = [p for p in EXPECTED if not re.search(p, text)]
        return not missing

    try:
        poll(all_there, 60, "omni_ray metrics on the export endpoint", interval_s=1.0)
    except AssertionError:
        raise AssertionError(f"missing after 60s: {missing}") from None
    print(f"\nmetrics exported within {time.monotonic() - t0:.1f}s")


def test_stage_gauges_read_zero_at_idle(serve_urls):
    """After a burst the stage gauges fall back to 0 (they kept their last non-zero value: the
    loop went idle before the finished requests left the engine's table)."""
    from serve_helpers import wait_clean

    url = serve_urls["async_chunk"]
    burst = [SSEClient(url, body(f"Burst {i}", max_tokens=6 + i % 4, frames=12 + i))
             for i in range(10)]
    for c in burst:
        c.start()
    for c in burst:
        c.join(120)
    assert all(c.status == 200 and c.error is None for c in burst)
    assert wait_clean(url, 10) == {}
    seen: dict[str, float] = {}

    def all_zero():
        nonlocal seen
        seen = stage_gauges(metrics_text())
        stages = {k.split()[1] for k in seen if k.startswith("queue_depth")}
        return {"thinker", "talker", "code2wav"} <= stages and not any(seen.values())

    try:
        poll(all_zero, 30, "every stage gauge at 0", interval_s=1.0)
    except AssertionError:
        raise AssertionError(f"stage gauges at idle: "
                             f"{ {k: v for k, v in seen.items() if v} or seen}") from None
