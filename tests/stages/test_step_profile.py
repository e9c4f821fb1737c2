"""``StageEngine.profile``: a ``torch.profiler`` summary of the engine's next steps under the
traffic running (stages/step_profile.py), on a real thinker engine actor on the tiny checkpoint."""

from __future__ import annotations

import time

import pytest
import torch
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


def _two_products(a):
    return torch.mm(a, a), torch.mm(a, a)


def _one_product(a):
    return torch.mm(a, a)


def test_callers_names_each_call_site_of_an_op_with_its_count():
    """``callers``: per op and Python call site, calls a step, from a capture with stacks (the
    mechanism that names where the host's waits for a GPU are made, exercised on an op CPU
    has). Each of the two functions that call ``mm`` is a site of its own, counted apart."""
    from omni_ray.stages.step_profile import StepProfile, callers

    prof = StepProfile("test", 4, stacks=True)
    prof.start()
    a = torch.ones(8, 8)
    for _ in range(4):
        _two_products(a)
        _one_product(a)
        prof.on_step()
    prof.stop()
    sites = callers(prof._prof.events(), {"aten::mm"}, prof.steps, packages=("test_step_profile",))
    by_fn = {s["where"][1].rsplit(": ", 1)[-1]: s for s in sites}
    assert set(by_fn) == {"_two_products", "_one_product"}, sites
    assert by_fn["_two_products"]["calls_per_step"] == 2.0
    assert by_fn["_one_product"]["calls_per_step"] == 1.0
    assert all(s["op"] == "aten::mm" and s["host_ms_per_step"] > 0 for s in sites)
    assert by_fn["_one_product"]["where"][1].startswith("test_step_profile.py(")
    summary = prof.summary()
    assert summary["stacks"] is True and summary["waits"] == []  # no CUDA wait on CPU
