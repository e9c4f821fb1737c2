"""``StageEngine.profile``: a ``torch.profiler`` summary of the engine's next steps under the
traffic running (stages/step_profile.py), on a real thinker engine actor on the tiny checkpoint."""

from __future__ import annotations

import time

import pytest
import ray

from omni_ray.config.request import OmniRequest


def _run(thinker_engine, rid: str, tokens: int):
    ray.get(thinker_engine.add_request.remote(OmniRequest(
        request_id=rid, prompt_token_ids=list(range(10, 40)), max_tokens=tokens,
        modalities=("text",)), None))
    return thinker_engine.stream.options(num_returns="streaming").remote(rid)


def test_profile_of_steps_under_traffic(thinker_engine):
    gen = _run(thinker_engine, "p-busy", 400)
    got = ray.get(thinker_engine.profile.remote(steps=6, timeout_s=60))
    for ref in gen:
        ray.get(ref)
    assert got["stage"] == "thinker" and got["steps"] == got["asked"] == 6
    assert got["ms_per_step"] > 0 and not got["device"] and got["top_device"] == []
    ops = {o["op"] for o in got["top_host"]}
    assert any(op.startswith("aten::") for op in ops), ops  # the model's forward, op by op
    assert all(o["calls_per_step"] > 0 and o["host_ms_per_step"] >= 0 for o in got["top_host"])
    assert got["table"].count("\n") > 5
    assert ray.get(thinker_engine.stats.remote())["requests"] == 0


def test_without_traffic_it_ends_at_the_timeout_with_what_it_saw(thinker_engine):
    t0 = time.perf_counter()
    got = ray.get(thinker_engine.profile.remote(steps=5, timeout_s=0.5))
    assert got["steps"] == 0 and got["asked"] == 5
    assert time.perf_counter() - t0 < 10


def test_one_capture_at_a_time_and_steps_checked(thinker_engine):
    first = thinker_engine.profile.remote(steps=1000, timeout_s=3)
    time.sleep(0.5)
    with pytest.raises(ValueError, match="a profile of the thinker engine is running"):
        ray.get(thinker_engine.profile.remote(steps=5, timeout_s=1))
    assert ray.get(first)["steps"] == 0
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ray.get(thinker_engine.profile.remote(steps=0))
    # the engine still serves, and a new capture may start
    for ref in _run(thinker_engine, "p-after", 8):
        ray.get(ref)
    assert ray.get(thinker_engine.profile.remote(steps=1, timeout_s=0.2))["steps"] == 0
