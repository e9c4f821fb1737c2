"""Garbage collection in the step records (stages/gc_clock.py): the collector's time is summed per
process, a stage engine adds it to its runner's counters, so each step record says how much of
the step was collection; the engine's start ends with a collection and ``gc.freeze``."""

from __future__ import annotations

import gc

import ray

from omni_ray.config.request import OmniRequest
from omni_ray.stages import gc_clock


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_collections_are_timed_by_generation():
    gc_clock.install()
    gc_clock.install()  # once per process, however often asked
    assert gc.callbacks.count(gc_clock._on_gc) == 1
    gc.disable()  # only the collections asked for below
    try:
        before = gc_clock.totals()
        garbage = [_Node() for _ in range(20000)]
        del garbage
        gc.collect(0)
        mid = gc_clock.totals()
        gc.collect()
        after = gc_clock.totals()
    finally:
        gc.enable()
    assert mid["gcs"] == before["gcs"] + 1 and mid["gc_s"] > before["gc_s"]
    assert mid["gc2_s"] == before["gc2_s"]  # a young collection is not a full one
    assert after["gcs"] == mid["gcs"] + 1 and after["gc2_s"] > mid["gc2_s"]


def test_step_records_carry_the_collections_inside_them(thinker_engine):
    start = ray.get(thinker_engine.stats.remote())["runner_time"]
    assert start["gcs"] >= 1  # the start's own collection, before gc.freeze
    ray.get(thinker_engine.add_request.remote(OmniRequest(
        request_id="gc-1", prompt_token_ids=list(range(10, 40)), max_tokens=200,
        modalities=("text",)), None))
    for ref in thinker_engine.stream.options(num_returns="streaming").remote("gc-1"):
        ray.get(ref)
    steps = ray.get(thinker_engine.steps.remote())["steps"]
    end = ray.get(thinker_engine.stats.remote())["runner_time"]
    assert len(steps) >= 200
    in_steps = sum(s["parts"].get("gcs", 0) for s in steps)
    assert in_steps >= 1, "200 steps of a model's forward and not one young collection?"
    assert in_steps <= end["gcs"] - start["gcs"]
    assert sum(s["parts"].get("gc_ms", 0.0) for s in steps) > 0
