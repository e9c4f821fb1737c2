"""The KV-transfer state machine (omni_ray/kv_lifecycle.py): legal moves, illegal ones, timings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omni_ray.kv_lifecycle import (
    TRANSITIONS,
    IllegalKVTransition,
    KVState,
    KVTransfer,
    KVTransferTable,
)

HAPPY = [KVState.HELD, KVState.EXTRACTED, KVState.TRANSFERRED, KVState.LOADED, KVState.RELEASED]
NON_TERMINAL = [KVState.REQUESTED, *HAPPY[:-1]]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def walk_to(state: KVState) -> KVTransfer:
    t = KVTransfer("r", clock=Clock())
    for s in HAPPY[:NON_TERMINAL.index(state)] if state in NON_TERMINAL else HAPPY:
        t.advance(s)
    return t


def test_module_imports_neither_torch_nor_ray():
    code = ("import sys, omni_ray.kv_lifecycle; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_happy_path_and_timings():
    t = KVTransfer("r", clock=Clock())
    held = []
    for s in HAPPY:
        t.advance(s)
        held.append(t.ref_held)
    assert t.state is KVState.RELEASED and t.terminal
    assert held == [False, True, True, True, False]
    assert [s for s, _ in t.history] == [KVState.REQUESTED, *HAPPY]
    assert t.handoff_s == 2.0  # EXTRACTED at 3, LOADED at 5
    assert t.summary()["fetch_s"] == 1.0 and t.summary()["state"] == "RELEASED"


@pytest.mark.parametrize("state", list(KVState), ids=lambda s: s.name)
def test_every_illegal_move_raises(state):
    for to in KVState:
        t = walk_to(state) if state not in (KVState.FAILED, KVState.ABORTED) else None
        if t is None:
            t = walk_to(KVState.HELD)
            t.fail("x") if state is KVState.FAILED else t.abort("x")
        if to in TRANSITIONS[state]:
            t.advance(to)
            assert t.state is to
        else:
            with pytest.raises(IllegalKVTransition):
                t.advance(to)
            assert t.state is state  # a refused move changes nothing


@pytest.mark.parametrize("state", NON_TERMINAL, ids=lambda s: s.name)
def test_abort_from_every_live_state(state):
    t = walk_to(state)
    t.abort("client gone")
    assert t.state is KVState.ABORTED and t.failed_at is state and not t.ref_held
    with pytest.raises(IllegalKVTransition):
        t.abort("twice")  # no double release
    with pytest.raises(IllegalKVTransition):
        t.advance(KVState.RELEASED)


@pytest.mark.parametrize("state", NON_TERMINAL[:-1], ids=lambda s: s.name)
def test_fail_from_every_state_before_loaded(state):
    t = walk_to(state)
    t.fail("boom")
    assert (t.state, t.failed_at, t.error) == (KVState.FAILED, state, "boom")
    with pytest.raises(IllegalKVTransition):
        t.fail("again")


def test_loaded_cannot_fail_and_terminal_states_are_final():
    t = walk_to(KVState.LOADED)
    with pytest.raises(IllegalKVTransition):
        t.fail("late")
    t.advance(KVState.RELEASED)
    for to in KVState:
        with pytest.raises(IllegalKVTransition):
            t.advance(to)


def test_table_counts_and_forgets():
    table = KVTransferTable(keep_recent=2)
    a, b = table.start("a"), table.start("b")
    with pytest.raises(ValueError):
        table.start("a")
    a.advance(KVState.HELD)
    a.advance(KVState.EXTRACTED)
    assert table.stats()["kv_refs_held"] == 1 and table.live == 2
    with pytest.raises(IllegalKVTransition):
        table.finish(a)  # not terminal yet
    a.fail("transfer timed out")
    a.fallback = True
    table.finish(a)
    b.abort("gone")
    table.finish(b)
    table.finish(b)  # idempotent once forgotten
    s = table.stats()
    assert (s["kv_transfers_live"], s["kv_refs_held"], s["kv_failed"], s["kv_aborted"],
            s["kv_fallbacks"], s["kv_released"]) == (0, 0, 1, 1, 1, 0)
    assert [r["request_id"] for r in table.recent] == ["a", "b"]
