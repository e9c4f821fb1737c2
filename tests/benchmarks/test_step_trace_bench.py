"""benchmarks/step_trace.py on step records shaped like session 19's c=32 burst: the first
chunks of 31 requests come out of three talker steps, the last one 700 ms long; the analysis
names those steps, how many each released and how long those requests had waited."""

from __future__ import annotations

from benchmarks import step_trace

T = 1000.0  # the level's first request, wall clock


def _step(at, ms, rows, emits, **parts):
    return dict(t=T + at, ms=ms, rows=rows, emits=emits, cmds=1, cmds_ms=0.1, parts=parts,
                engine="a")


def _burst():
    steps = [_step(0.10, 20, 6, 0, sched_new=6, sched_prompt_tokens=900),
             _step(0.12, 30, 6, 6),  # 6 first frames
             _step(0.15, 25, 6, 0),
             _step(0.17, 250, 11, 0, sched_new=5, sched_prompt_tokens=750, admit_ms=4),
             _step(0.42, 30, 11, 5),  # 5 first frames
             _step(0.45, 700, 31, 0, sched_new=20, sched_prompt_tokens=2048, engine_ms=690),
             _step(1.15, 40, 31, 20),  # the last 20
             _step(1.19, 35, 31, 31)]  # later frames: no first chunk in it
    marks = []
    for i in range(31):
        first_in = T + (0.05 if i < 6 else 0.15 if i < 11 else 0.3)
        down = T + (0.149 if i < 6 else 0.449 if i < 11 else 1.189)  # in its step
        marks.append({"talker": {"first_in": first_in, "first_down": down}})
    marks.append({"ingress": {"received": T}})  # a text-only request: no talker marks
    return steps, marks


def test_the_burst_is_told_by_the_steps_that_released_it():
    steps, marks = _burst()
    for i, m in enumerate(marks[:31]):
        m["ingress"] = {"received": T + 0.001 * i}
    got = step_trace.summarize({"talker": steps, "thinker": steps[:2]}, marks, T, burst=11)
    # the first 11 requests' burst: until the step that released the 11th
    assert [s["at_s"] for s in got["talker_opening"]] == [0.1, 0.12, 0.15, 0.17, 0.42]
    assert step_trace.opening_line(got) == (
        "5 steps to +0.42s, 355 ms stepping; over 2x p50: +0.17s 250 ms (11 rows; admit 4 "
        "sched_prompt_tokens 750 sched_new 5)")
    rel = got["talker_releases"]
    assert [g["released"] for g in rel] == [6, 5, 20]
    assert [g["step"]["at_s"] for g in rel] == [0.12, 0.42, 1.15]
    assert rel[2]["waited_ms_min"] == rel[2]["waited_ms_max"] == 889.0
    talker = got["talker"]
    assert talker["steps"] == 8 and talker["ms_max"] == 700
    top = talker["slowest"][0]
    assert (top["at_s"], top["rows"], top["parts"]["sched_new"]) == (0.45, 31, 20)
    assert [s["ms"] for s in talker["slowest"]] == [700, 250, 40, 35, 30]
    line = step_trace.slow_line(got)
    assert "talker p50 32.5 max 700 ms at +0.45s" in line and "sched_new 20" in line
    assert "engine 690" in line and line.startswith("thinker")
    assert step_trace.releases_line(got).startswith(
        "6 @ +0.12s (step 30 ms, 6 rows, waited 99-99 ms), 5 @ +0.42s")


def test_nothing_to_say_without_the_endpoint_or_steps():
    assert step_trace.summarize(None, [], T) is None
    assert step_trace.stage_summary([], T) == dict(steps=0)
    got = step_trace.summarize({"talker": []}, _burst()[1], T)
    assert got["talker_releases"] == [] and step_trace.releases_line(got) == ""


def test_steps_that_met_a_new_shape_are_told_apart_from_the_others():
    """code2wav's step records count its forwards and those of a first-seen (batch, frames);
    the summary puts the two kinds of step side by side, the line says it, and a stage that
    counts no forwards (the talker) gets neither."""
    steps = [_step(0.1, 120, 3, 3, forwards=1, new_shapes=1),
             _step(0.2, 30, 3, 3, forwards=1),
             _step(0.3, 100, 5, 5, forwards=1, new_shapes=1),
             _step(0.4, 20, 5, 5, forwards=1),
             _step(0.5, 5, 1, 1),  # a replayed first call: no eager forward
             _step(0.6, 25, 5, 5, forwards=1),
             _step(0.7, 9, 5, 5, forwards=1, graph_steps=1),  # a padded forward, replayed
             _step(0.8, 11, 5, 5, forwards=1, graph_steps=1)]
    got = step_trace.summarize({"code2wav": steps, "talker": _burst()[0]}, [], T)
    assert got["code2wav"]["new_shapes"] == dict(
        new=dict(steps=2, ms_p50=110.0, ms_mean=110.0),
        seen=dict(steps=5, ms_p50=20.0, ms_mean=19.0),
        graphed=dict(steps=2, ms_p50=10.0, ms_mean=10.0))
    assert step_trace.shapes_line(got) == (
        "code2wav forwards of a new (batch, frames): 2 steps, p50 110.0 ms, mean 110.0; the "
        "others: 5 steps, p50 20.0 ms, mean 19.0; replayed as graphs: 2 steps, p50 10.0 ms, "
        "mean 10.0")
    assert "new_shapes" not in got["talker"] and step_trace.shapes_line(got, "talker") == ""
    assert "new_shapes 1" in step_trace.slow_line(got)


class _TwoReplicas:
    """``GET /debug/steps`` of a stage with two replicas, Serve's routing given as a pattern:
    each answer is the last ``limit`` steps of the replica the pattern names."""

    def __init__(self, pattern: str):
        self.pattern, self.limits = pattern, []
        self.steps = {e: [dict(t=T + i, ms=1.0 + i) for i in range(3)] for e in "ab"}

    def get(self, url, params, headers=None, timeout=None):
        import httpx

        engine = self.pattern[len(self.limits) % len(self.pattern)]
        self.limits.append(params["limit"])
        body = {"actor_id": engine, "steps": self.steps[engine][-params["limit"]:]}
        return httpx.Response(200, json=body, request=httpx.Request("GET", url))


def test_fetch_finds_the_replica_serve_rarely_routes_to_and_fetches_it_whole(monkeypatch):
    stage = _TwoReplicas("aaaaabaaabaaaaaaaaaa")  # the 6th and the 10th calls reach b
    monkeypatch.setattr(step_trace.httpx, "get", stage.get)
    got = step_trace.fetch("http://app", T, stages=("talker",))
    assert sorted((s["engine"], s["ms"]) for s in got["talker"]) == [
        (e, 1.0 + i) for e in "ab" for i in range(3)]  # both engines' steps, whole
    # one full fetch, probes of one step, full fetches until one reaches b, probes again
    assert stage.limits == [8192, 1, 1, 1, 1, 1, 8192, 8192, 8192, 8192] + [1] * (
        step_trace.SAMPLES - 10)
    stage = _TwoReplicas("abb")
    monkeypatch.setattr(step_trace.httpx, "get", stage.get)
    got = step_trace.fetch("http://app", T, stages=("talker",))
    assert len(got["talker"]) == 6  # b found by the first probe, fetched by the next call
    assert stage.limits == [8192, 1, 8192] + [1] * (step_trace.SAMPLES - 3)
