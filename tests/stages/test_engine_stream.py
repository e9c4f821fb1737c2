"""``StageEngine.stream``: a request's items go to the reader in lists, at most one list per
``pipeline.stream_interval_ms``; every item arrives, in order, whatever the interval (a real
thinker engine actor on the tiny checkpoint, in the session's Ray cluster)."""

from __future__ import annotations

import time

import pytest
import ray

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import StageConfig
from omni_ray.payload import decode_chunk
from omni_ray.stages.engine import StageEngine

TOKENS = 48  # long enough that the answer is still being made while it streams
INTERVAL_MS = 400


def _read(engine, rid: str) -> list[tuple[float, list]]:
    """(arrival s after the stream call, decoded items) per list the stream yields."""
    out = []
    t0 = time.perf_counter()
    for ref in engine.stream.options(num_returns="streaming").remote(rid):
        out.append((time.perf_counter() - t0, [decode_chunk(b) for b in ray.get(ref)]))
    return out


@pytest.fixture(scope="module")
def engines(ray_cluster, tiny_model_dir):
    made = {ms: ray.remote(StageEngine).options(num_cpus=0).remote(
        "thinker", tiny_model_dir, StageConfig(), PipelineConfig(stream_interval_ms=ms))
        for ms in (0, INTERVAL_MS)}
    ray.get([e.ready.remote() for e in made.values()])
    yield made
    for e in made.values():
        ray.kill(e)


def test_items_are_coalesced_per_interval_and_none_is_lost(engines, omni_by_mode):
    prompt = omni_by_mode["sync"].prompt_ids("Tell me a story.")
    want = omni_by_mode["sync"].generate(OmniRequest(
        request_id="ref", prompt_token_ids=prompt, max_tokens=TOKENS, modalities=("text",)))[0]
    got = {}
    for ms, engine in engines.items():
        rid = f"s{ms}"
        ray.get(engine.add_request.remote(OmniRequest(
            request_id=rid, prompt_token_ids=prompt, max_tokens=TOKENS, modalities=("text",)),
            None))
        lists = _read(engine, rid)
        items = [i for _, batch in lists for i in batch]
        assert [i.seq for i in items] == list(range(len(items)))  # in order, none missing
        assert items[-1].finished and not any(i.finished for i in items[:-1])
        assert [t for i in items for t in i.token_ids] == want.text_token_ids
        got[ms] = lists
    # The engine yields list k at least k intervals after list 0, and the reader started its
    # clock before list 0 was made, so n lists need n - 1 intervals by the last one's arrival
    # (however late the reader gets them). Ignoring the interval breaks it: 48 tokens come in
    # many more lists than that.
    slow = got[INTERVAL_MS]
    assert len(slow) <= 1 + slow[-1][0] / (INTERVAL_MS / 1000) + 1e-6, [
        (round(t, 3), len(b)) for t, b in slow]
    assert len(slow) < TOKENS


def test_the_step_records_account_for_the_stats(engines, omni_by_mode):
    """``StageEngine.steps``: one record per step the stats count, their rows sum to the stats'
    rows, they began after the request was sent, and they sent what the stream read."""
    engine = engines[0]
    prompt = omni_by_mode["sync"].prompt_ids("Count to ten.")
    before = ray.get(engine.stats.remote())
    t0 = time.time()
    ray.get(engine.add_request.remote(OmniRequest(
        request_id="traced", prompt_token_ids=prompt, max_tokens=12, modalities=("text",)), None))
    items = [i for _, batch in _read(engine, "traced") for i in batch]
    after = ray.get(engine.stats.remote())
    got = ray.get(engine.steps.remote(t0))
    steps = got["steps"]
    assert got["stage"] == "thinker" and got["actor_id"] == after["actor_id"]
    assert len(steps) == after["steps"] - before["steps"] > 0
    assert sum(s["rows"] for s in steps) == (after["loop_time"]["rows"]
                                             - before["loop_time"]["rows"])
    assert sum(s["emits"] for s in steps) == len(items)  # a token (and the end) an emit
    assert all(t0 <= s["t"] <= time.time() and s["ms"] > 0 for s in steps)
    assert sum(s["parts"].get("engine_ms", 0) for s in steps) <= sum(s["ms"] for s in steps)
    assert ray.get(engine.steps.remote(time.time() + 60))["steps"] == []
