"""``StepTrace``: one record per step, what the runner's counters grew by in that step only, the
steps since a time, bounded (stages/step_trace.py)."""

from __future__ import annotations

import pytest

from omni_ray.stages.step_trace import StepTrace


def test_each_step_gets_what_its_counters_grew_by():
    tr = StepTrace()
    tr.baseline(dict(admit_s=5.0, prefills=40, label="x"))  # the start's: no step's
    tr.record(100.0, 0.010, 3, 2, 1, 0.001, dict(admit_s=5.002, prefills=43, label="x"))
    tr.record(100.02, 0.700, 20, 20, 4, 0.003, dict(admit_s=5.042, prefills=63, label="x"))
    tr.record(100.8, 0.012, 20, 20, 0, 0.0, dict(admit_s=5.042, prefills=63, label="x"))
    got = tr.since()
    assert [s["rows"] for s in got] == [3, 20, 20]
    assert got[0]["parts"] == {"admit_ms": pytest.approx(2.0), "prefills": 3}
    assert got[1]["parts"] == {"admit_ms": pytest.approx(40.0), "prefills": 20}
    assert got[2]["parts"] == {}  # nothing grew
    assert got[1]["ms"] == pytest.approx(700.0) and got[1]["cmds_ms"] == pytest.approx(3.0)
    assert (got[1]["emits"], got[1]["cmds"]) == (20, 4)


def test_since_and_limit_pick_the_latest_steps():
    tr = StepTrace()
    for i in range(10):
        tr.record(float(i), 0.001, 1, 0, 0, 0.0, None)
    assert [s["t"] for s in tr.since(7.0)] == [7.0, 8.0, 9.0]
    assert [s["t"] for s in tr.since(0.0, limit=2)] == [8.0, 9.0]
    assert tr.since(0.0, limit=0) == []
    assert all(s["parts"] == {} for s in tr.since())


def test_it_keeps_only_the_last_steps():
    tr = StepTrace(keep=4)
    for i in range(9):
        tr.record(float(i), 0.001, 1, 0, 0, 0.0, {"frames": i})
    assert len(tr) == 4
    assert [s["t"] for s in tr.since()] == [5.0, 6.0, 7.0, 8.0]
    assert [s["parts"] for s in tr.since()] == [{"frames": 1}] * 4
