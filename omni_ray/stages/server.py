"""Serve deployments of the three stages (undecorated; ``builders`` applies ``serve.deployment``).

A replica creates its engine actor (which loads the model) and handles the control plane:

``open(request, downstream)`` is a streaming method. It registers the request with the engine,
yields the engine's actor handle first (the ingress passes it to the upstream stage, so all of a
request's chunks for this stage reach this replica), then yields the request's encoded output
items until the end. Cancelling the call (client gone, ingress abort) aborts the request in the
engine; an engine error ends the stream with ``StageRequestError``. If the engine actor dies, every
request on it ends with ``StageRequestError`` at once and ``check_health`` fails from then on, so
Serve replaces the replica (and its engine) within ``health_check_period_s``.
"""

from __future__ import annotations

import asyncio
import logging

from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import OmniServingArgs
from omni_ray.stages.logic import StageRequestError

logger = logging.getLogger("ray.serve")


class StageServer:
    stage: str = ""

    def __init__(self, args: OmniServingArgs | dict):
        import ray

        args = OmniServingArgs.model_validate(args)
        cfg = self.stage_config(args)
        model_dir = args.checkpoint_dir()
        res = cfg.engine_resources
        options = dict(num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources,
                       max_concurrency=1000, name=None)
        pg = ray.util.get_current_placement_group()
        if pg is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=len(pg.bundle_specs) - 1)
        engine_cls, engine_kwargs = self.engine_spec(args)
        self.engine = ray.remote(engine_cls).options(**options).remote(
            self.stage, model_dir, cfg, args.pipeline, args.max_model_len, **engine_kwargs)
        self._ready = self.engine.ready.remote()
        self._engine_died: str | None = None  # set once the engine actor is gone for good
        self._engine_started = False  # the engine answered ready once

    @classmethod
    def stage_config(cls, args: OmniServingArgs):
        """This stage's ``StageConfig`` (the disaggregated thinker's servers override it)."""
        return getattr(args, cls.stage)

    def engine_spec(self, args: OmniServingArgs) -> tuple[type, dict]:
        """The engine actor class and its extra constructor kwargs."""
        from omni_ray.stages.engine import StageEngine

        return StageEngine, {}

    async def open(self, request: OmniRequest, downstream=None, **add_kwargs):
        """``add_kwargs`` go to the engine's ``add_request`` (``expect_kv`` for ThinkerDecode)."""
        from ray.exceptions import ActorDiedError, RayActorError

        rid = request.request_id
        try:
            await self._ready
            await self.engine.add_request.remote(request, downstream, **add_kwargs)
            # Claim the request's stream before yielding: the caller pulls the next item only
            # once every stage is open, which can take seconds, and the engine aborts requests
            # whose stream is not claimed in time (engine.UNCLAIMED_S).
            gen = self.engine.stream.options(num_returns="streaming").remote(rid)
            yield self.engine
            async for ref in gen:
                yield await ref
        except (asyncio.CancelledError, GeneratorExit):
            self.engine.abort.remote(rid)  # fire and forget: we are being cancelled
            raise
        except RayActorError as e:
            if isinstance(e, ActorDiedError):
                self._engine_died = type(e).__name__
                raise StageRequestError("engine died; the replica is being replaced") from None
            raise StageRequestError(f"engine unreachable ({type(e).__name__})") from None

    async def abort(self, request_id: str) -> bool:
        return await self.engine.abort.remote(request_id)

    async def fail_next_step(self, request_id: str) -> None:
        await self.engine.fail_next_step.remote(request_id)

    async def stats(self) -> dict:
        await self._ready
        return await self.engine.stats.remote()

    async def readiness(self) -> dict:
        """Answers at once: can this replica serve now (its engine loaded and alive)?"""
        import ray

        if self._engine_died is not None:
            return {"ready": False, "reason": f"engine died ({self._engine_died})"}
        if not self._engine_started:
            done, _ = ray.wait([self._ready], timeout=0)
            if not done:
                return {"ready": False, "reason": "engine loading"}
            try:
                await self._ready
            except Exception as e:  # noqa: BLE001 - the start failed: say so
                return {"ready": False, "reason": f"engine failed to start ({type(e).__name__})"}
            self._engine_started = True
        try:  # a loaded engine answers at once, unless its process is gone
            await asyncio.wait_for(self.engine.ready.remote(), timeout=2)
        except Exception as e:  # noqa: BLE001
            return {"ready": False, "reason": f"engine not answering ({type(e).__name__})"}
        return {"ready": True, "reason": None}

    async def check_health(self) -> None:
        """Fails once the engine actor is dead (or its loop died): Serve replaces the replica.

        Serve's first check (part of the replica's start) waits for the engine to load, however
        long that takes (a vLLM engine: a minute or more); later ones allow 30 s."""
        if self._engine_died is not None:
            raise RuntimeError(f"{self.stage} engine died ({self._engine_died})")
        if not self._engine_started:
            await self._ready  # raises if the engine failed to load
            self._engine_started = True
            return
        await asyncio.wait_for(self.engine.ready.remote(), timeout=30)


class ThinkerServer(StageServer):
    stage = "thinker"


class TalkerServer(StageServer):
    stage = "talker"


class Code2WavServer(StageServer):
    stage = "code2wav"


STAGE_SERVERS = {"thinker": ThinkerServer, "talker": TalkerServer, "code2wav": Code2WavServer}
