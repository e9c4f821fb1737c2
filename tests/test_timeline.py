"""``omni_ray.timeline.Timeline`` (per-request milestones) and ``benchmarks.timeline.breakdown``
(the time to first audio split into stages and hops)."""

from __future__ import annotations

import pytest

from benchmarks.timeline import (
    INGRESS_AFTER,
    INGRESS_PARTS,
    SEGMENTS,
    TOTAL,
    breakdown,
    per_request,
)
from omni_ray.timeline import Timeline


def test_first_mark_wins_and_unknown_ids_are_ignored():
    tl = Timeline(keep=2)
    tl.start("a", t=1.0)
    tl.mark("a", "first_in")
    first = tl.get(["a"])["a"]["first_in"]
    tl.mark("a", "first_in")
    assert tl.get(["a"])["a"] == {"added": 1.0, "first_in": first}
    tl.mark("late", "first_in")  # a chunk for a request not (or no longer) here
    assert tl.get(["late"]) == {} and len(tl) == 1


def test_bounded_live_and_done():
    tl = Timeline(keep=2)
    for rid in "abc":
        tl.start(rid)
    assert len(tl) == 2 and tl.get(["a"]) == {}  # a stream that never ran: forgotten
    for rid in "bc":
        tl.finish(rid)
    tl.start("d")
    tl.finish("d")
    assert len(tl) == 0 and tl.recent(5) == ["c", "d"] and tl.recent(1) == ["d"]
    assert set(tl.get(["b", "c", "d"])) == {"c", "d"}
    tl.mark("d", "first_out")  # finished: no new marks
    assert "first_out" not in tl.get(["d"])["d"]


def test_breakdown_segments_add_up_to_the_total():
    t = iter(range(100))
    req = {}
    for _, (stage, mark), _ in SEGMENTS:
        req.setdefault(stage, {})[mark] = float(next(t)) * 0.01 + ({"talker": 0.005}.get(stage, 0))
    req["ingress"]["first_audio"] = 1.0
    rows = breakdown([req])
    parts = sum(rows[name]["p50"] for name, _, _ in SEGMENTS)
    assert parts == pytest.approx(rows[TOTAL[0]]["p50"]) and rows[TOTAL[0]]["p50"] == 1.0
    text_only = {"ingress": {"received": 0.0}, "thinker": {"added": 0.1, "first_down": 0.2}}
    assert set(breakdown([text_only])) == {SEGMENTS[0][0], SEGMENTS[1][0]}


def test_ingress_parts_split_the_first_segment():
    first = SEGMENTS[0]
    assert INGRESS_PARTS[0][1] == first[1] and INGRESS_PARTS[-1][2] == first[2]
    for (_, _, end), (_, start, _) in zip(INGRESS_PARTS, INGRESS_PARTS[1:]):
        assert end == start  # consecutive
    marks = [a for _, a, _ in INGRESS_PARTS] + [INGRESS_PARTS[-1][2], INGRESS_AFTER[2]]
    req = {}
    for i, (stage, mark) in enumerate(marks):
        req.setdefault(stage, {})[mark] = i * 0.001
    rows = breakdown([req], [*INGRESS_PARTS, INGRESS_AFTER])
    assert list(rows) == [name for name, _, _ in [*INGRESS_PARTS, INGRESS_AFTER]]
    parts = sum(rows[name]["p50"] for name, _, _ in INGRESS_PARTS)
    assert parts == pytest.approx(breakdown([req])[first[0]]["p50"])


def test_per_request_rows_are_in_arrival_order_with_their_segments():
    def req(t0, talker_ms, audio=True):
        r = {"ingress": {"received": t0}, "thinker": {"added": t0 + 0.01, "first_down": t0 + 0.02}}
        if audio:
            r["talker"] = {"first_in": t0 + 0.03, "first_down": t0 + 0.03 + talker_ms / 1e3}
        return r

    rows = per_request([req(5.5, 40), req(5.0, 1300), req(5.2, 0, audio=False)])
    assert [r["t0_s"] for r in rows] == [0.0, 0.2, 0.5]
    assert [r["talker"] for r in rows] == [1300.0, None, 40.0]  # the slow one, named
    assert rows[0]["thinker"] == 10.0 and rows[0]["ingress first audio"] is None
