"""``StageEngine.stream``: a request's items go to the reader in lists, the first at once, then at
most one list per ``pipeline.stream_interval_ms``; every item arrives, in order, whatever the
interval (a real thinker engine actor on the tiny checkpoint, in the session's Ray cluster)."""

from __future__ import annotations

import time

import pytest
import ray

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import StageConfig
from omni_ray.payload import decode_chunk
from omni_ray.stages.engine import StageEngine

TOKENS = 24


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
        for ms in (0, 400)}
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
    slow = got[400]
    assert len(slow[0][1]) == 1  # the first token is not held back for the interval
    gaps = [b[0] - a[0] for a, b in zip(slow, slow[1:])]
    assert all(g >= 0.39 for g in gaps), gaps  # then one list per interval at most
    # 24 tokens in far fewer lists than tokens: the first alone, the rest per 400 ms window
    assert len(slow) <= 2 + slow[-1][0] / 0.4
    assert len(got[0]) >= len(slow)
