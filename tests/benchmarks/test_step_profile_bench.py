"""benchmarks/step_profile.py's diff on two replicas' stats: the stage logic's counters
(``COUNTED``) grow over a level like the loop clocks do, summed over the replicas, and a stage
whose logic keeps no such counter gets no key."""

from __future__ import annotations

from benchmarks import step_profile


def _stats(steps, rows, held=None):
    s = dict(steps=steps, loop_time=dict(step_s=steps * 0.01, commands_s=0.0, rows=rows),
             runner_time={})
    if held is not None:
        s["first_chunks_held"] = held
    return s


def test_the_talkers_held_first_chunks_are_counted_over_the_level():
    before = {"talker": {"a": _stats(10, 10, held=2), "b": _stats(5, 5, held=0)},
              "code2wav": {"c": _stats(3, 3)}}
    after = {"talker": {"a": _stats(30, 50, held=5), "b": _stats(25, 40, held=4)},
             "code2wav": {"c": _stats(9, 12)}}
    prof = step_profile.diff(before, after, wall_s=1.0)
    assert prof["talker"]["first_chunks_held"] == 7  # 3 + 4, the level's alone
    assert prof["talker"]["steps"] == 40 and prof["talker"]["replicas"] == 2
    assert "first_chunks_held" not in prof["code2wav"]
