"""``EngineSupervisor`` bookkeeping with stand-in engine handles (no Ray cluster): a death
restarts the engine, refusals meanwhile, the restart budget per window, a failed start gives up.
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


def test_documented_restart_defaults_equal_the_config():
    """docs/faults.md states the engine_restart defaults; they must be the config's."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).parents[2] / "docs" / "faults.md").read_text().split())
    documented = {k: float(v) for k, v in
                  re.findall(r"`(max_restarts|window_s|retry_after_s)` \(default ([\d.]+)", text)}
    assert documented == {k: float(v) for k, v in EngineRestartConfig().model_dump().items()}
