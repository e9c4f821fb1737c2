"""Serve deployments of the three stages (undecorated; ``builders`` applies ``serve.deployment``).

A replica creates its engine actor (which loads the model) through an ``EngineSupervisor``
(stages/supervisor.py), which starts a new engine at once when the old one dies, and handles the
control plane:

``open(request, downstream)`` is a streaming method. It registers the request with the engine,
yields the engine's actor handle first (the ingress passes it to the upstream stage, so all of a
request's chunks for this stage reach this replica), then yields the request's encoded output
items (lists of them, as ``StageEngine.stream`` batches them) until the end. Cancelling the call
(client gone, ingress abort) aborts the request in the engine; an engine error ends the stream
with ``StageRequestError``. While the replica has no ready engine (loading, or restarting after
its engine died) ``open`` raises ``EngineUnavailable`` before yielding anything (the ingress
answers 503 + ``Retry-After``); requests under way on an engine that dies end with
``StageRequestError`` at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from omni_ray.config.request import STANDBY_WARMUP_ID_PREFIX, WARMUP_ID_PREFIX, OmniRequest
from omni_ray.config.serving import OmniServingArgs
from omni_ray.exceptions import EngineUnavailable
from omni_ray.pipeline.emit import StageRequestError
from omni_ray.stages.supervisor import EngineState, EngineSupervisor
from omni_ray.timeline import Timeline

logger = logging.getLogger("ray.serve")


class StageServer:
    stage: str = ""

    def __init__(self, args: OmniServingArgs | dict):
        args = OmniServingArgs.model_validate(args)
        cfg = self.stage_config(args)
        model_dir = args.checkpoint_dir()
        from omni_ray.metrics import SupervisorMetrics

        self.cfg = cfg  # renew_engine replaces it: the next engine is made from it
        self.sup = EngineSupervisor(self.stage,
                                    lambda: self._create_engine(args, self.cfg, model_dir),
                                    cfg.engine_restart, SupervisorMetrics(self.stage))
        # ``open``'s arrival here (``replica_open``), joined with the engine's milestones
        self.timeline = Timeline()

    @property
    def engine(self):
        """The current engine actor (a new one after a restart)."""
        return self.sup.engine

    def _create_engine(self, args: OmniServingArgs, cfg, model_dir: str):
        import ray

        res = cfg.engine_resources
        options = dict(num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources,
                       max_concurrency=1000, name=None)
        if env := res.env_vars():  # MPS share and priority: merged into the inherited env
            options["runtime_env"] = {"env_vars": env}
        pg = ray.util.get_current_placement_group()
        if pg is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=len(pg.bundle_specs) - 1)
        engine_cls, engine_kwargs = self.engine_spec(args)
        return ray.remote(engine_cls).options(**options).remote(
            self.stage, model_dir, cfg, args.pipeline, args.max_model_len,
            **engine_kwargs)

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

        arrived = time.time()
        rid = request.request_id
        warmup = rid.startswith(WARMUP_ID_PREFIX)
        engine = self._engine_for(rid)  # EngineUnavailable: nothing opened yet
        self.timeline.start(rid, "replica_open", arrived)
        opened = False
        try:
            try:
                await engine.add_request.remote(request, downstream, **add_kwargs)
            except ActorDiedError:
                # Died before this request started. If its standby took over (just now, in
                # report_death), the request goes there instead of being refused.
                self.sup.report_death(engine, "ActorDiedError")
                if not (self.sup.ready and self.sup.engine is not engine):
                    raise
                engine = self._engine_for(rid)
                await engine.add_request.remote(request, downstream, **add_kwargs)
            opened = True
            # Claim the request's stream before yielding: the caller pulls the next item only
            # once every stage is open, which can take seconds, and the engine aborts requests
            # whose stream is not claimed in time (engine.UNCLAIMED_S).
            gen = engine.stream.options(num_returns="streaming").remote(rid)
            yield engine
            async for ref in gen:
                yield await ref
            if warmup:
                self.sup.warmed(engine)
        except (asyncio.CancelledError, GeneratorExit):
            engine.abort.remote(rid)  # fire and forget: we are being cancelled
            raise
        except RayActorError as e:
            if isinstance(e, ActorDiedError):
                self.sup.report_death(engine, type(e).__name__)
                if not opened:  # died before this request started: a refusal, not a failure
                    raise EngineUnavailable(self.stage, self.sup.reason or "engine died",
                                            self.sup.policy.retry_after_s) from None
                raise StageRequestError("engine died; a new one is starting") from None
            raise StageRequestError(f"engine unreachable ({type(e).__name__})") from None
        finally:
            self.timeline.finish(rid)

    def _engine_for(self, rid: str):
        """The engine for a new request: a standby warm-up request goes to the standby (when
        one is loaded), any other to the active engine (``EngineUnavailable`` when none)."""
        if rid.startswith(WARMUP_ID_PREFIX):
            return self.sup.engine_for_warmup(rid.startswith(STANDBY_WARMUP_ID_PREFIX))
        return self.sup.engine_for_request()

    async def abort(self, request_id: str) -> bool:
        return await self.engine.abort.remote(request_id)

    async def fail_next_step(self, request_id: str) -> None:
        await self.engine.fail_next_step.remote(request_id)

    async def stats(self) -> dict:
        await self.sup.wait_ready(timeout_s=120)
        out = await self.engine.stats.remote()
        return {**out, **self.sup.stats()}

    async def profile(self, steps: int, timeout_s: float, stacks: bool = False) -> dict:
        """This replica's engine's ``profile`` (stages/step_profile.py)."""
        await self.sup.wait_ready(timeout_s=120)
        return await self.engine.profile.remote(steps, timeout_s, stacks)

    async def tune(self, fields: dict) -> dict:
        """This replica's engine's ``tune`` (a running app's live pipeline fields)."""
        await self.sup.wait_ready(timeout_s=120)
        return await self.engine.tune.remote(fields)

    async def steps(self, since: float, limit: int) -> dict:
        """This replica's engine's last steps (stages/step_trace.py)."""
        await self.sup.wait_ready(timeout_s=120)
        return await self.engine.steps.remote(since, limit)

    async def renew_engine(self, mps: dict, timeout_s: float = 900.0) -> dict:
        """This replica's engine under other MPS settings (``engine_resources``' ``mps_*``,
        ``POST /debug/engines``): replaced (the supervisor's ``renew``) unless it runs under
        them already. ``ValueError`` for a field that cannot change. Returns the replica's id,
        whether the engine was replaced, in how many seconds, and its MPS environment."""
        from ray import serve

        await self.sup.wait_ready(timeout_s)  # (another call's renewal first)
        resources = self.cfg.engine_resources.with_mps(mps)
        t0 = time.monotonic()
        renewed = resources != self.cfg.engine_resources
        if renewed:
            self.cfg = self.cfg.model_copy(update={"engine_resources": resources})
            await self.sup.renew(", ".join(f"{k} {v}" for k, v in mps.items()), timeout_s)
        return dict(replica=serve.get_replica_context().replica_id.unique_id, renewed=renewed,
                    seconds=round(time.monotonic() - t0, 1),
                    mps=(await self.engine.stats.remote()).get("mps"))

    async def request_timeline(self, request_ids: list[str]) -> dict:
        """This replica's engine's milestones of these requests (omni_ray/timeline.py)."""
        here = self.timeline.get(request_ids)
        if not self.sup.ready:
            return here
        there = await self.engine.request_timeline.remote(request_ids)
        return {rid: {**here.get(rid, {}), **there.get(rid, {})}
                for rid in dict.fromkeys([*here, *there])}

    async def readiness(self) -> dict:
        """Answers at once: can this replica serve now (its engine loaded and alive)? With
        ``restarting`` when its engine died and a new one is starting; with a standby
        (``engine_restart.standby``) also ``standby_ready`` and ``standby_warm``."""
        self.sup.start()
        standby = ({"standby_ready": self.sup.standby_loaded, "standby_warm": self.sup.standby_warm}
                   if self.sup.policy.standby else {})
        if not self.sup.ready:
            return {"ready": False, "reason": self.sup.reason,
                    "restarting": self.sup.state is EngineState.RESTARTING, **standby}
        from ray.exceptions import ActorDiedError

        engine = self.engine
        try:  # a loaded engine answers at once, unless its process is gone
            await asyncio.wait_for(engine.ready.remote(), timeout=1.5)
        except ActorDiedError:
            self.sup.report_death(engine, "ActorDiedError")
            if self.sup.ready:  # its standby took over
                return {"ready": True, "reason": None, **standby}
            return {"ready": False, "reason": self.sup.reason, "restarting": True, **standby}
        except Exception as e:  # noqa: BLE001
            return {"ready": False, "reason": f"engine not answering ({type(e).__name__})",
                    **standby}
        return {"ready": True, "reason": None, **standby}

    async def check_health(self) -> None:
        """Fails only when the supervisor gave up (an engine failed to start, or died too often)
        or the ready engine stops answering: then Serve replaces the replica. A restart under way
        is healthy (the supervisor is bringing the engine back).

        Serve's first check (part of the replica's start) waits for the engine to load and warm
        up, however long that takes (a vLLM engine: a minute or more); later ones allow 30 s."""
        if self.sup.state is EngineState.STARTING:
            await self.sup.wait_ready()  # raises once the start failed
            return
        if self.sup.state is EngineState.FAILED:
            raise RuntimeError(f"{self.stage} engine: {self.sup.reason}")
        if self.sup.state is EngineState.READY:
            try:
                await asyncio.wait_for(self.engine.ready.remote(), timeout=30)
            except asyncio.TimeoutError:
                raise RuntimeError(f"{self.stage} engine hung (no answer in 30 s)") from None
            except Exception:  # noqa: BLE001 - dead or its loop died: the supervisor restarts it
                pass


class ThinkerServer(StageServer):
    stage = "thinker"


class TalkerServer(StageServer):
    stage = "talker"


class Code2WavServer(StageServer):
    stage = "code2wav"


STAGE_SERVERS = {"thinker": ThinkerServer, "talker": TalkerServer, "code2wav": Code2WavServer}
