"""Readiness of a stage replica (``StageServer.readiness``, behind the ingress's ``/health``):
not ready while its engine loads, ready once it serves, not ready once its engine is gone.
Real Ray, a real engine actor loading the tiny checkpoint."""

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
        await server._ready
        ready = await server.readiness()
        pid = (await server.engine.stats.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        dead = await server.readiness()
        while dead["ready"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            dead = await server.readiness()
        return first, ready, dead

    first, ready, dead = asyncio.run(main())
    assert first == {"ready": False, "reason": "engine loading"}
    assert ready == {"ready": True, "reason": None}
    assert not dead["ready"] and "engine" in dead["reason"]
