"""Tombstones: an abort that arrives before its request refuses the late add, boundedly."""

from omni_ray.stages.tombstones import Tombstones


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_an_abort_before_its_add_is_taken_once():
    ts = Tombstones()
    ts.add("a")
    assert ts.take("a") and not ts.take("a") and not ts.take("b")


def test_entries_expire_and_are_bounded():
    clock = Clock()
    ts = Tombstones(ttl_s=10, max_size=3, clock=clock)
    for rid in "abcd":
        ts.add(rid)
    assert len(ts) == 3 and not ts.take("a")  # the oldest went first
    clock.t = 11
    assert len(ts) == 0 and not ts.take("d")
