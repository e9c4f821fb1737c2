"""The disaggregated-thinker app at rest: no disconnect timing leaves state in any stage, runner,
KV table or ingress hand-off (issue 18, item 10), and the prefill engine exports the stage
series like every other engine (item 11)."""

from __future__ import annotations

import re

import pytest
from kv_helpers import TIMEOUTS, kv_args, wait_clean
from serve_helpers import body, disconnect_storm, metrics_text, poll, run_alone, stage_gauges

pytestmark = pytest.mark.slow

APP, PREFIX = "omni-kv-state", "/kv-state"
ROUNDS, PER_ROUND = 12, 10


@pytest.fixture(scope="module")
def kv_app(serve_port, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    disagg = {"timeouts": TIMEOUTS, "fallback": "local_prefill"}
    serve.run(build_omni_app(kv_args(tiny_model_dir, thinker_disaggregation=disagg)),
              name=APP, route_prefix=PREFIX)
    yield f"http://127.0.0.1:{serve_port}{PREFIX}"
    serve.delete(APP)


def leaving_body(rng, label: str) -> dict:
    return body(f"Leave {label}", audio=rng.random() < 0.8, max_tokens=rng.randint(4, 30),
                frames=rng.randint(8, 60))


def test_random_disconnects_leave_no_state(kv_app):
    n = disconnect_storm(kv_app, leaving_body, ROUNDS, PER_ROUND, seed=11)
    busy = wait_clean(kv_app, 10)
    assert busy == {}, f"state left 10 s after {n} disconnects: {busy}"
    run_alone(kv_app, body("Still there?", max_tokens=6, frames=12))


def test_prefill_engine_exports_stage_series(kv_app):
    run_alone(kv_app, body("Metrics of the prefill", max_tokens=6, frames=12))
    want = [r'ray_omni_ray_stage_batch_size_bucket\{[^}]*stage="thinker_prefill"',
            r'ray_omni_ray_stage_queue_depth\{[^}]*stage="thinker_prefill"',
            r'ray_omni_ray_stage_running_requests\{[^}]*stage="thinker_prefill"',
            r'ray_omni_ray_stage_batch_size_bucket\{[^}]*stage="thinker_decode"']
    text = ""

    def exported():
        nonlocal text
        text = metrics_text()
        return all(re.search(p, text) for p in want)

    poll(exported, 60, "the prefill/decode stage series", interval_s=1.0)
    assert wait_clean(kv_app, 10) == {}
    poll(lambda: not any(v for k, v in stage_gauges(metrics_text()).items()
                         if "thinker_" in k), 30, "the thinker_* gauges at 0", interval_s=1.0)
