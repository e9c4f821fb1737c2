"""Readiness of a stage replica (``StageServer.readiness``, behind the ingress's ``/health``):
not ready while its engine loads, ready once it serves, not ready (naming why) once its engine is
gone, and ready again once the replica's supervisor has started a new engine. Real Ray, real
engine actors loading the tiny checkpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow


def test_stage_readiness_follows_its_engine(ray_cluster, tiny_model_dir):
    from omni_ray.stages.server import Code2WavServer

    async def main():
        server = Code2WavServer({"model": tiny_model_dir})
        first = await server.readiness()  # the engine is still importing torch and loading
        await server.sup.wait_ready(timeout_s=300)
        ready = await server.readiness()
        pid = (await server.engine.stats.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        dead = await server.readiness()
        while dead["ready"] and time.monotonic() < t_kill + 30:
            await asyncio.sleep(0.05)
            dead = await server.readiness()
        await server.sup.wait_ready(timeout_s=60)
        back = await server.readiness()
        new_pid = (await server.engine.stats.remote())["pid"]
        return first, ready, dead, back, pid, new_pid, server.sup.restarts

    first, ready, dead, back, pid, new_pid, restarts = asyncio.run(main())
    assert first == {"ready": False, "reason": "engine loading", "restarting": False}
    assert ready == {"ready": True, "reason": None}
    assert not dead["ready"] and "engine died" in dead["reason"] and dead["restarting"], dead
    assert back == {"ready": True, "reason": None} and new_pid != pid and restarts == 1


def test_engine_that_dies_too_often_is_given_up(ray_cluster, tiny_model_dir):
    """``engine_restart.max_restarts: 0``: no restart; the replica fails its health check (Serve
    replaces it), and new requests are refused with ``EngineUnavailable``."""
    from omni_ray.exceptions import EngineUnavailable
    from omni_ray.stages.server import Code2WavServer

    async def main():
        server = Code2WavServer({"model": tiny_model_dir,
                                 "code2wav": {"engine_restart": {"max_restarts": 0}}})
        await server.sup.wait_ready(timeout_s=300)
        os.kill((await server.engine.stats.remote())["pid"], signal.SIGKILL)
        end = time.monotonic() + 30
        while server.sup.state.value != "failed" and time.monotonic() < end:
            await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="max_restarts=0"):
            await server.check_health()
        with pytest.raises(EngineUnavailable):
            server.sup.engine_for_request()
        return await server.readiness()

    state = asyncio.run(main())
    assert not state["ready"] and "max_restarts=0" in state["reason"], state
    assert not state["restarting"], state
