"""Concurrent requests through the Serve app (async_chunk): the thinker's chunks reach the
talker in fewer actor calls than chunks (``pipeline.coalesce_pushes``: one call per receiving
engine and turn of the sender's loop), and every answer still equals the offline pipeline's."""

from __future__ import annotations

import concurrent.futures as cf
import time

import numpy as np
import pytest
from chat_helpers import ask, offline_answer

from benchmarks import step_profile

pytestmark = pytest.mark.slow

PROMPTS = ["Hello there, how are you?", "Name three colours.", "Count to five.",
           "What is the weather like?", "Tell me a joke.", "Say goodbye."]
TOKENS = 32


def _answer_all(url: str) -> tuple[dict, list]:
    """The six prompts at once, streamed: the step profile around them and the answers."""
    before = step_profile.fetch(url)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: ask(url, text=p, stream=True, max_tokens=TOKENS),
                            PROMPTS))
    return step_profile.diff(before, step_profile.fetch(url), time.perf_counter() - t0), got


def test_concurrent_chunks_share_calls_and_answers_equal_offline(serve_urls, offline):
    url = serve_urls["async_chunk"]
    prof, got = _answer_all(url)
    talker = prof["talker"]
    # every chunk arrived, in fewer calls: the requests' chunks of a thinker step travel together
    assert 0 < talker["pushes_in"] < talker["chunks_in"], talker
    assert 0 < prof["code2wav"]["pushes_in"] <= prof["code2wav"]["chunks_in"], prof["code2wav"]
    assert talker["first_chunks_held"] == 0  # counted; this app holds none (no hold field)
    for prompt, (text, pcm, finish, _) in zip(PROMPTS, got):
        ref_text, ref_pcm = offline_answer(offline["async_chunk"], text=prompt,
                                           max_tokens=TOKENS)
        assert text == ref_text, prompt
        assert pcm is not None and pcm.shape == ref_pcm.shape, prompt
        assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1, prompt
        assert finish in ("stop", "length")


def test_the_pushes_change_live_and_bad_fields_are_4xx(serve_urls, offline):
    """``POST /debug/pipeline``: ``coalesce_pushes`` off on the running app's engines (no
    restart): the next concurrent requests' chunks take one call each, their answers unchanged;
    back on, fewer calls again. A field built into a runner, an unknown one or a bad value is a
    400 naming it, and changes nothing."""
    import httpx

    url = serve_urls["async_chunk"]

    def tune(**fields):
        return httpx.post(f"{url}/debug/pipeline", json=fields, timeout=120)

    for fields, param in (({"initial_chunk_frames": 2}, "initial_chunk_frames"),
                          ({"no_such_field": 1}, "no_such_field"),
                          ({"stream_interval_ms": -5}, "stream_interval_ms"),
                          ({"code2wav_urgent_ms": 20000}, "code2wav_urgent_ms"),
                          # needs ramp_chunks, which this app does not have
                          ({"hold_first_chunk_above": 4}, "hold_first_chunk_above")):
        r = tune(**fields)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    try:
        r = tune(coalesce_pushes=False)
        assert r.status_code == 200, r.text
        engines = r.json()
        assert set(engines) == {"thinker", "talker", "code2wav"}
        assert all(live["coalesce_pushes"] is False and live["stream_interval_ms"] == 20
                   and live["code2wav_urgent_ms"] == 0
                   for stage in engines.values() for live in stage.values()), engines
        prof, got = _answer_all(url)
        talker = prof["talker"]
        assert talker["pushes_in"] == talker["chunks_in"] > 0, talker  # one call a chunk
        for prompt, (text, pcm, _, _) in zip(PROMPTS, got):
            ref_text, ref_pcm = offline_answer(offline["async_chunk"], text=prompt,
                                               max_tokens=TOKENS)
            assert text == ref_text, prompt
            assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1, prompt
    finally:
        assert tune(coalesce_pushes=True).status_code == 200
    talker = _answer_all(url)[0]["talker"]
    assert 0 < talker["pushes_in"] < talker["chunks_in"], talker
