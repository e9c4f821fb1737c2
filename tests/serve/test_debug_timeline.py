"""``GET /debug/timeline``: every stage notes its milestones of a request, and they split the
time to first audio into stages and hops (benchmarks/timeline.py; issue 20's "where the time
goes"), in both delivery modes, through the real app and the ``openai`` client."""

from __future__ import annotations

import time

import httpx
import pytest
from openai import OpenAI
from serve_helpers import MODEL

from benchmarks import timeline

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["async_chunk", "sync"])
def test_timeline_splits_the_time_to_first_audio(serve_urls, mode):
    url = serve_urls[mode]
    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    t0 = time.time()
    ttfa = rid = None
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
        modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
        max_tokens=8, stream=True, extra_body={"max_audio_frames": 12})
    for chunk in stream:
        rid = chunk.id
        delta = chunk.choices[0].delta if chunk.choices else None
        audio = delta and (getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio"))
        data = (audio.get("data") if isinstance(audio, dict) else audio.data) if audio else None
        if data and ttfa is None:
            ttfa = time.time() - t0
    assert ttfa is not None

    reqs = timeline.fetch(url, 1)
    assert [r["request_id"] for r in reqs] == [rid]
    req = reqs[0]
    assert {"ingress", "thinker", "talker", "code2wav"} <= set(req)
    rows = timeline.breakdown(reqs)
    assert [name for name, _, _ in timeline.SEGMENTS] + [timeline.TOTAL[0]] == list(rows)
    total = rows[timeline.TOTAL[0]]["p50"]
    assert 0 < total <= ttfa
    for name, _, _ in timeline.SEGMENTS:  # one host's clock: every step forward in time
        assert rows[name]["p50"] >= -1e-3, (name, rows[name])
    assert sum(rows[n]["p50"] for n, _, _ in timeline.SEGMENTS) == pytest.approx(total)
    ing = [*timeline.INGRESS_PARTS, timeline.INGRESS_AFTER]
    parts = timeline.breakdown(reqs, ing)  # the ingress segment split, every mark there
    assert list(parts) == [name for name, _, _ in ing]
    assert all(s["p50"] >= -1e-3 for s in parts.values()), parts
    assert sum(parts[n]["p50"] for n, _, _ in timeline.INGRESS_PARTS) == pytest.approx(
        rows[timeline.SEGMENTS[0][0]]["p50"])
    assert {"replica_open", "added"} <= set(req["talker"]) and "replica_open" in req["code2wav"]
    if mode == "sync":  # the talker starts when the thinker has finished: after the text
        assert req["talker"]["first_in"] >= req["thinker"]["first_out"]


def test_timeline_of_several_requests_in_order(serve_urls):
    url = serve_urls["async_chunk"]
    ids = []
    for i in range(3):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": f"Number {i}"}],
            "max_tokens": 4, "modalities": ["text"]})
        assert r.status_code == 200
        ids.append(r.json()["id"])
    got = timeline.fetch(url, 3)
    assert [r["request_id"] for r in got] == ids
    assert all("talker" not in r for r in got)  # text only: no talker, no code2wav
    r = httpx.get(f"{url}/debug/timeline", params={"limit": 0}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"], r.text


def test_step_profile_accounts_for_one_request(serve_urls):
    """``/debug/stats``' loop clocks, diffed around one spoken answer (benchmarks/step_profile.py):
    every stage stepped, stepping and commands take at most the wall, and the talker stepped once
    per frame it made (one request alone: one row per step)."""
    from benchmarks import step_profile

    url = serve_urls["async_chunk"]
    before = step_profile.fetch(url)
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", timeout=180, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8, "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"}, "max_audio_frames": 12})
    wall = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    prof = step_profile.diff(before, step_profile.fetch(url), wall)
    assert set(prof) == {"thinker", "talker", "code2wav"}
    for stage, row in prof.items():
        assert row["steps"] > 0 and row["ms_per_step"] > 0, (stage, row)
        assert 0 < row["share"]["step"] + row["share"]["commands"] <= 1.05, (stage, row)
    assert prof["thinker"]["steps"] >= r.json()["usage"]["completion_tokens_details"]["text_tokens"]
    assert prof["talker"]["requests_per_step"] == 1.0
    assert "|" in step_profile.table(prof)


def test_debug_profile_captures_the_talkers_steps_under_a_request(serve_urls):
    """``GET /debug/profile``: a ``torch.profiler`` summary of a stage engine's next steps, taken
    while a spoken answer is made (stages/step_profile.py); bad parameters are 4xx naming them."""
    import threading

    url = serve_urls["async_chunk"]
    answer = {}

    def speak():
        answer["r"] = httpx.post(f"{url}/v1/chat/completions", timeout=180, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 32, "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"}, "max_audio_frames": 90})

    t = threading.Thread(target=speak)
    t.start()
    r = httpx.get(f"{url}/debug/profile", params={"stage": "talker", "steps": 3}, timeout=120)
    sites = httpx.get(f"{url}/debug/profile", timeout=120,
                      params={"stage": "talker", "steps": 2, "stacks": "true"})
    t.join()
    assert answer["r"].status_code == 200
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["stage"] == "talker" and got["steps"] == 3 and got["stacks"] is False
    # with stacks: the same summary, and the waits for a GPU by call site (none on CPU)
    assert sites.status_code == 200, sites.text
    assert sites.json()["stacks"] is True and sites.json()["steps"] == 2
    assert sites.json()["waits"] == [] and sites.json()["top_host"]
    assert any(o["op"].startswith("aten::") for o in got["top_host"])
    # every op's time summed covers at least the top op's; device time only where there is one
    assert got["host_ms_per_step_total"] >= got["top_host"][0]["host_ms_per_step"] > 0
    assert (got["device_ms_per_step_total"] > 0) is got["device"]
    if got["device"]:
        assert got["device_ms_per_step_total"] >= got["top_device"][0]["device_ms_per_step"]
    for params, field in (({"stage": "vocoder"}, "stage"), ({"stage": "talker", "steps": 0},
                                                             "steps"),
                          ({"stage": "talker", "stacks": "maybe"}, "stacks")):
        bad = httpx.get(f"{url}/debug/profile", params=params, timeout=30)
        assert bad.status_code == 400 and field in str(bad.json()["error"]["param"]), bad.text


def test_debug_steps_name_the_talker_steps_that_sent_each_first_chunk(serve_urls):
    """``GET /debug/steps``: the engines' step records (stages/step_trace.py), under four
    concurrent spoken answers. The talker's records are the steps its stats count, and each
    request's first chunk to code2wav is stamped inside the step that made it: the grouping of
    benchmarks/step_trace.py finds every request in exactly one such step. Bad parameters are
    a 4xx naming them."""
    import concurrent.futures

    from benchmarks import step_profile, step_trace

    url = serve_urls["async_chunk"]
    before = step_profile.fetch(url)
    t0 = time.time()

    def speak(i):
        return httpx.post(f"{url}/v1/chat/completions", timeout=180, json={
            "model": MODEL, "messages": [{"role": "user", "content": f"Story number {i}."}],
            "max_tokens": 8, "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"}, "max_audio_frames": 10})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(speak, range(4)))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    after = step_profile.fetch(url)
    trace = step_trace.fetch(url, t0, samples=1)
    assert set(trace) == set(step_trace.STAGES)
    talker = trace["talker"]
    (actor,) = after["talker"]
    assert len(talker) == after["talker"][actor]["steps"] - before["talker"][actor]["steps"]
    assert all(s["t"] >= t0 and s["ms"] > 0 for s in talker)
    marks = timeline.fetch(url, 4)
    assert sorted(m["request_id"] for m in marks) == sorted(r.json()["id"] for r in answers)
    for m in marks:  # stamped inside a talker step that sent something
        down = m["talker"]["first_down"]
        assert any(s["t"] <= down <= s["t"] + s["ms"] / 1e3 and s["emits"] for s in talker), m
    got = step_trace.summarize(trace, marks, t0)
    assert sum(g["released"] for g in got["talker_releases"]) == 4
    assert all(g["step"]["emits"] >= g["released"] for g in got["talker_releases"])
    assert got["talker"]["steps"] == len(talker) and got["talker"]["slowest"]
    assert "talker p50" in step_trace.slow_line(got)
    for params, field in (({"stage": "vocoder"}, "stage"), ({"stage": "talker", "limit": 0},
                                                             "limit")):
        bad = httpx.get(f"{url}/debug/steps", params=params, timeout=30)
        assert bad.status_code in (400, 422) and field in bad.text, bad.text
