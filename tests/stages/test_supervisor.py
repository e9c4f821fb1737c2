"""``EngineSupervisor`` bookkeeping with stand-in engine handles (no Ray cluster): a death
restarts the engine, refusals meanwhile, the restart budget per window, a failed start gives up;
with ``standby``: promotion, a standby that dies, one still loading, the budget.
The real-actor paths are in tests/serve/test_readiness.py and tests/serve/test_faults.py."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorDiedError

from omni_ray.config.serving import EngineRestartConfig
from omni_ray.exceptions import EngineUnavailable
from omni_ray.stages.supervisor import EngineState, EngineSupervisor


class _Call:
    def __init__(self, fn):
        self.fn = fn

    def remote(self):
        return self.fn()


class FakeEngine:
    """``ready`` answers once ``loaded`` is set (or raises ``load_error``); ``lifeline`` fails
    with ActorDiedError once ``kill()`` is called."""

    def __init__(self, load_error: Exception | None = None):
        self.loaded, self.dead = asyncio.Event(), asyncio.Event()
        self.load_error = load_error
        self.ready = _Call(self._ready)
        self.lifeline = _Call(self._lifeline)

    async def _ready(self):
        await self.loaded.wait()
        if self.load_error is not None:
            raise self.load_error
        return "stage"

    async def _lifeline(self):
        await self.dead.wait()
        raise ActorDiedError()

    def kill(self):
        self.dead.set()


async def _until(cond, timeout_s: float = 2.0):
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


def _supervisor(policy: EngineRestartConfig, engines: list, load_error=None):
    def create():
        e = FakeEngine(load_error if engines else None)
        e.loaded.set()
        engines.append(e)
        return e

    return EngineSupervisor("talker", create, policy)


def test_a_dead_engine_is_restarted_and_meanwhile_requests_are_refused():
    async def main():
        engines = []

        def create():
            e = FakeEngine()
            if not engines:
                e.loaded.set()  # the first loads at once; the second when the test says
            engines.append(e)
            return e

        sup = EngineSupervisor("code2wav", create, EngineRestartConfig(retry_after_s=3))
        await sup.wait_ready(2)
        assert sup.engine_for_request() is engines[0]
        engines[0].kill()
        await _until(lambda: len(engines) == 2)
        state = sup.state
        with pytest.raises(EngineUnavailable) as info:
            sup.engine_for_request()
        engines[1].loaded.set()
        await sup.wait_ready(2)
        return sup, engines, state, info.value

    sup, engines, state, err = asyncio.run(main())
    assert state is EngineState.RESTARTING
    assert err.stage == "code2wav" and err.retry_after_s == 3
    assert "engine died (ActorDiedError); restarting it" in str(err)
    assert sup.engine_for_request() is engines[1] and sup.restarts == 1
    assert sup.last_failover_s is not None


def test_restarts_past_the_budget_give_up():
    async def main():
        engines = []
        sup = _supervisor(EngineRestartConfig(max_restarts=2, window_s=60), engines)
        for i in range(3):
            await sup.wait_ready(2)
            engines[i].kill()
            await _until(lambda i=i: len(engines) == i + 2 or sup.state is EngineState.FAILED)
        await _until(lambda: sup.state is EngineState.FAILED)
        with pytest.raises(RuntimeError, match="max_restarts=2"):
            await sup.wait_ready(1)
        return sup, engines

    sup, engines = asyncio.run(main())
    assert sup.restarts == 2 and len(engines) == 3


def test_a_first_start_that_fails_gives_up_at_once():
    async def main():
        def create():
            e = FakeEngine(RuntimeError("no such checkpoint"))
            e.loaded.set()
            return e

        sup = EngineSupervisor("thinker", create, EngineRestartConfig())
        with pytest.raises(RuntimeError, match="failed to start"):
            await sup.wait_ready(2)
        return sup

    sup = asyncio.run(main())
    assert sup.state is EngineState.FAILED and sup.restarts == 0


def test_a_new_engine_that_cannot_be_created_gives_up():
    async def main():
        engines = []

        def create():
            if engines:
                raise RuntimeError("no resources for the new engine")
            e = FakeEngine()
            e.loaded.set()
            engines.append(e)
            return e

        sup = EngineSupervisor("talker", create, EngineRestartConfig())
        await sup.wait_ready(2)
        engines[0].kill()
        await _until(lambda: sup.state is EngineState.FAILED)
        return sup

    sup = asyncio.run(main())
    assert "no resources for the new engine" in sup.reason


# -- the hot standby (engine_restart.standby) -----------------------------------------------------
def _standby_supervisor(engines: list, load_at_once=True, **policy):
    """Engines load at once unless ``load_at_once`` is False for the standbys (index >= 1)."""
    def create():
        e = FakeEngine()
        if load_at_once or not engines:
            e.loaded.set()
        engines.append(e)
        return e

    return EngineSupervisor("talker", create, EngineRestartConfig(standby=True, **policy))


def test_the_standby_is_made_after_the_active_is_ready_and_promoted_at_once():
    async def main():
        engines = []

        def create():
            e = FakeEngine()
            engines.append(e)
            return e

        sup = EngineSupervisor("talker", create, EngineRestartConfig(standby=True))
        sup.start()
        await asyncio.sleep(0.05)
        made_before_ready = len(engines)  # the active still loading: no standby yet
        engines[0].loaded.set()
        await sup.wait_ready(2)
        await _until(lambda: len(engines) == 2)
        engines[1].loaded.set()
        await _until(lambda: sup.standby_loaded)
        stats_before = sup.stats()
        engines[0].kill()
        await _until(lambda: sup.engine is engines[1])
        state_at_promotion = sup.state  # READY at once: no model load
        await _until(lambda: len(engines) == 3)  # the next standby, in the background
        return sup, engines, made_before_ready, stats_before, state_at_promotion

    sup, engines, made_before_ready, before, state = asyncio.run(main())
    assert made_before_ready == 1
    assert before["standby_ready"] is True and before["standby"] == "loaded"
    assert state is EngineState.READY and sup.engine_for_request() is engines[1]
    assert sup.restarts == 1 and sup.promotions == 1 and sup.last_failover_s < 0.5
    assert sup.standby is engines[2] and sup.standby_state == "loading"


def test_report_death_promotes_the_loaded_standby_without_waiting_for_the_watch():
    async def main():
        engines = []
        sup = _standby_supervisor(engines)
        await sup.wait_ready(2)
        await _until(lambda: sup.standby_loaded)
        sup.report_death(engines[0], "ActorDiedError")  # e.g. found by a request's call
        promoted = sup.engine is engines[1] and sup.ready
        engines[0].kill()  # the watch sees it now: not a second death
        await _until(lambda: len(engines) == 3 and sup.standby_loaded)
        await asyncio.sleep(0.05)
        return sup, promoted

    sup, promoted = asyncio.run(main())
    assert promoted and sup.restarts == 1 and sup.promotions == 1 and len(sup._deaths) == 1


def test_the_standby_is_warmed_by_requests_routed_to_it():
    async def main():
        engines = []
        sup = _standby_supervisor(engines, load_at_once=False)
        await sup.wait_ready(2)
        await _until(lambda: len(engines) == 2)
        assert sup.engine_for_warmup(standby=True) is engines[0]  # not loaded: the active
        engines[1].loaded.set()
        await _until(lambda: sup.standby_loaded)
        target = sup.engine_for_warmup(standby=True)
        sup.warmed(target)
        sup.warmed(engines[0])  # the active's warm-ups are not the standby's
        return sup, engines, target

    sup, engines, target = asyncio.run(main())
    assert target is engines[1] and sup.engine_for_warmup(standby=False) is engines[0]
    assert sup.standby_warm and sup.standby_warmups == 1 and sup.stats()["standby"] == "warm"


def test_a_standby_that_dies_is_replaced_and_the_active_keeps_serving():
    async def main():
        engines = []
        sup = _standby_supervisor(engines)
        await sup.wait_ready(2)
        await _until(lambda: sup.standby_loaded)
        engines[1].kill()
        await _until(lambda: len(engines) == 3 and sup.standby_loaded)
        return sup, engines

    sup, engines = asyncio.run(main())
    assert sup.engine_for_request() is engines[0] and sup.ready
    assert sup.standby is engines[2] and sup.standby_restarts == 1 and sup.restarts == 0


def test_a_standby_still_loading_when_the_active_dies_becomes_the_engine_waited_for():
    async def main():
        engines = []
        sup = _standby_supervisor(engines, load_at_once=False)
        await sup.wait_ready(2)
        await _until(lambda: len(engines) == 2)  # the standby, loading
        engines[0].kill()
        await _until(lambda: sup.state is EngineState.RESTARTING)
        with pytest.raises(EngineUnavailable, match="restarting it"):
            sup.engine_for_request()
        taken_over = sup.engine is engines[1] and len(engines) == 2  # no third load meanwhile
        engines[1].loaded.set()
        await sup.wait_ready(2)
        await _until(lambda: len(engines) == 3)  # a new standby once it is ready
        return sup, engines, taken_over

    sup, engines, taken_over = asyncio.run(main())
    assert taken_over and sup.engine_for_request() is engines[1]
    assert sup.restarts == 1 and sup.promotions == 0 and sup.last_failover_s is not None


def test_standby_deaths_count_against_the_restart_budget():
    async def main():
        engines = []
        sup = _standby_supervisor(engines, max_restarts=1, window_s=60)
        await sup.wait_ready(2)
        await _until(lambda: sup.standby_loaded)
        engines[1].kill()  # death 1: within the budget, a new standby
        await _until(lambda: len(engines) == 3 and sup.standby_loaded)
        engines[2].kill()  # death 2: over it, no new standby; the active still serves
        await _until(lambda: "given up" in sup.standby_state)
        still_serving = sup.engine_for_request() is engines[0]
        engines[0].kill()  # death 3: over the budget, no standby to promote anyway
        await _until(lambda: sup.state is EngineState.FAILED)
        return sup, engines, still_serving

    sup, engines, still_serving = asyncio.run(main())
    assert still_serving and len(engines) == 3 and sup.standby_restarts == 1
    assert "max_restarts=1" in sup.reason and sup.restarts == 0


def test_no_promotion_past_the_budget():
    async def main():
        engines = []
        sup = _standby_supervisor(engines, max_restarts=0)
        await sup.wait_ready(2)
        await _until(lambda: sup.standby_loaded)
        engines[0].kill()
        await _until(lambda: sup.state is EngineState.FAILED)
        return sup

    sup = asyncio.run(main())
    assert sup.promotions == 0 and "max_restarts=0" in sup.reason


def test_documented_restart_defaults_equal_the_config():
    """docs/faults.md states the engine_restart defaults; they must be the config's."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).parents[2] / "docs" / "faults.md").read_text().split())
    found = re.findall(r"`(max_restarts|window_s|retry_after_s|standby)` \(default "
                       r"`?(false|true|[\d.]+)", text)
    documented = {k: v == "true" if v in ("true", "false") else float(v) for k, v in found}
    assert documented == {k: v if isinstance(v, bool) else float(v)
                          for k, v in EngineRestartConfig().model_dump().items()}


@pytest.mark.parametrize("standby", [False, True])
def test_renew_ends_the_old_engine_and_its_standby_first_and_spends_no_budget(monkeypatch,
                                                                              standby):
    """``renew``: the engine made again (other settings) without counting a death; requests
    are refused while the new one loads, and nothing new is created before the old one ended."""
    from omni_ray.stages import supervisor

    monkeypatch.setattr(supervisor, "_kill", lambda e: e.kill())

    async def main():
        engines, live_at_create = [], []

        def create():
            live_at_create.append(sum(not e.dead.is_set() for e in engines))
            e = FakeEngine()
            engines.append(e)
            return e

        sup = EngineSupervisor("thinker", create, EngineRestartConfig(max_restarts=0,
                                                                      standby=standby))
        sup.start()
        engines[0].loaded.set()
        await sup.wait_ready(2)
        if standby:
            await _until(lambda: len(engines) == 2)
            engines[1].loaded.set()
            await _until(lambda: sup.standby_loaded)
        n = len(engines)
        task = asyncio.create_task(sup.renew("mps_sm_percent 70", timeout_s=2))
        await _until(lambda: len(engines) == n + 1)
        with pytest.raises(EngineUnavailable, match="replacing the engine"):
            sup.engine_for_request()
        engines[n].loaded.set()
        await task
        if standby:  # the next standby, made by the new create()
            await _until(lambda: len(engines) == n + 2)
        return sup, engines, live_at_create, n

    sup, engines, live_at_create, n = asyncio.run(main())
    assert sup.state is EngineState.READY and sup.engine_for_request() is engines[n]
    assert all(e.dead.is_set() for e in engines[:n])  # the old engine and its standby
    assert live_at_create[n] == 0  # ... ended before the new one was created
    # max_restarts=0: a death would have failed the supervisor; a renewal is not one
    assert sup.restarts == 0 and sup.renewals == 1 and sup.stats()["engine_renewals"] == 1
