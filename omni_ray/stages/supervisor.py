"""Keeps a stage replica's engine actor alive: ``EngineSupervisor``.

The replica's engine actor is created and watched here. One call to the engine's ``lifeline``
is always pending; it fails the moment the actor's process dies (or returns when its step loop
dies), and the supervisor then starts a new engine in the same replica at once (its model loads
again, on a GPU in its start turn: stages/gpu_start.py).
Meanwhile ``engine_for_request`` refuses with ``EngineUnavailable`` (the ingress answers 503 +
``Retry-After``) and ``reason`` says why. Past ``max_restarts`` deaths within ``window_s``, or
when an engine fails to start, the state is FAILED: the replica's ``check_health`` fails and
Serve replaces the whole replica.

Hot standby (``engine_restart.standby``): once the active engine is ready, a second engine
actor is created and loaded beside it (after, never at the same time: two engines loading on one
GPU trip vLLM's memory profile; each load also takes its GPU start turn). It serves nothing but
the ingress's standby warm-up requests (ids ``STANDBY_WARMUP_ID_PREFIX``, routed to it by
``engine_for_warmup``). When the active engine dies and the standby is loaded, the standby
becomes the active engine at once (READY again without a model load) and a new standby starts
in the background. A standby still loading when the active dies becomes the engine being waited
for (the usual restart, with a head start). Every death, active or standby, counts against
``max_restarts`` per ``window_s``; a standby that dies past the budget is not replaced (the
active engine keeps serving).

``renew`` replaces the engine on purpose, when ``create()`` now makes it with other settings (a
stage's MPS share, ``POST /debug/engines``): the old engine and any standby are ended first (one
load on a GPU at a time), requests are refused meanwhile as in a restart, and no restart budget
is spent.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Callable

from omni_ray.config.serving import EngineRestartConfig
from omni_ray.exceptions import EngineUnavailable

logger = logging.getLogger("ray.serve")


class EngineState(enum.Enum):
    STARTING = "starting"      # the first engine loads (and warms up)
    READY = "ready"
    RESTARTING = "restarting"  # the engine died; a new one loads (and warms up)
    FAILED = "failed"          # given up: Serve's health check replaces the replica


class EngineSupervisor:
    def __init__(self, stage: str, create: Callable[[], object], policy: EngineRestartConfig,
                 metrics=None):
        """``create()`` makes a new engine actor (its handle). ``metrics``: a
        ``SupervisorMetrics`` (omni_ray/metrics.py) or None."""
        self.stage, self.policy, self.metrics = stage, policy, metrics
        self._create = create
        self._created = time.monotonic()
        self.engine = create()
        self.state = EngineState.STARTING
        self.reason = "engine loading"
        self.restarts = 0  # the active engine replaced (by a new engine or its standby)
        self.promotions = 0  # ... of those, by promoting a loaded standby
        self.renewals = 0  # the active engine replaced on purpose (``renew``)
        self._renewing: str | None = None  # why, while a renewal waits for the old one's end
        self.last_failover_s: float | None = None  # death -> new engine ready, the latest one
        self.load_s: float | None = None  # the current engine's creation -> ready
        self._deaths: deque[float] = deque()
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()  # set while READY
        # The standby (engine_restart.standby): its handle while it exists.
        self.standby = None
        self.standby_state = "off" if not policy.standby else "waiting for the active engine"
        self.standby_loaded = False  # loaded: promoted at once when the active engine dies
        self.standby_warmups = 0  # warm-up requests it finished (ingress/warmup.py)
        self.standby_restarts = 0  # standbys replaced after dying
        self._standby_created = 0.0
        self._standby_load_s: float | None = None
        self._standby_task: asyncio.Task | None = None

    # -- what the replica asks ------------------------------------------------------------------
    def start(self) -> None:
        """Start watching (idempotent; needs the replica's event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    @property
    def standby_warm(self) -> bool:
        return self.standby_loaded and self.standby_warmups > 0

    def engine_for_request(self):
        """The engine to give a new request, or ``EngineUnavailable`` when there is none."""
        self.start()
        if self.state is not EngineState.READY:
            raise EngineUnavailable(self.stage, self.reason, self.policy.retry_after_s)
        return self.engine

    def engine_for_warmup(self, standby: bool):
        """The engine for a warm-up request: the loaded standby when ``standby`` and there is
        one, else the engine for any request."""
        if standby and self.standby_loaded and self.standby is not None:
            return self.standby
        return self.engine_for_request()

    def warmed(self, engine) -> None:
        """A warm-up request finished on ``engine`` (counted only for the standby)."""
        if engine is self.standby and self.standby is not None:
            self.standby_warmups += 1
            if self.standby_loaded:
                self.standby_state = "warm"

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until an engine is ready; raises RuntimeError once FAILED."""
        self.start()
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while self.state is not EngineState.READY:
            if self.state is EngineState.FAILED:
                raise RuntimeError(f"{self.stage} engine: {self.reason}")
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{self.stage} engine not ready: {self.reason}")
            try:
                await asyncio.wait_for(self._ready.wait(), timeout=min(left or 1.0, 1.0))
            except asyncio.TimeoutError:
                pass

    async def renew(self, why: str, timeout_s: float | None = None) -> None:
        """Replace the ready engine with a new one from ``create()`` (its settings changed): the
        old engine and any standby are ended first, then the new one loads; returns once it is
        ready (``wait_ready``'s errors). Not a death: ``restarts`` and the budget stay."""
        await self.wait_ready(timeout_s)
        self._renewing = why
        self._set(EngineState.RESTARTING, f"replacing the engine ({why})")
        standby, _, _ = self._take_standby()
        if standby is not None:
            _kill(standby)
        _kill(self.engine)  # the watch sees it end and creates the new one
        await self.wait_ready(timeout_s)

    def report_death(self, engine, why: str) -> None:
        """A call on ``engine`` found it dead: stop giving it out now (the watch restarts it),
        or promote the loaded standby now."""
        if engine is not self.engine or self.state is not EngineState.READY:
            return
        if self.standby_loaded:
            self._replace(why, time.monotonic())
        else:
            self._set(EngineState.RESTARTING, f"engine died ({why}); restarting it")

    def stats(self) -> dict:
        """The supervisor's part of the stage's ``/debug/stats``."""
        return {"engine_restarts": self.restarts, "engine_renewals": self.renewals,
                "engine_load_s": self.load_s,
                "engine_failover_s": self.last_failover_s, "engine_promotions": self.promotions,
                "standby": self.standby_state, "standby_ready": self.standby_loaded,
                "standby_warmups": self.standby_warmups,
                "standby_restarts": self.standby_restarts,
                "standby_load_s": self._standby_load_s}

    # -- the watch --------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._supervise()
        except Exception as e:  # noqa: BLE001 - e.g. a new engine could not even be created:
            self._fail(f"engine supervisor failed ({_brief(e)})")  # Serve replaces the replica

    async def _supervise(self) -> None:
        from ray.exceptions import ActorDiedError, RayActorError

        died_at: float | None = None
        while True:
            engine = self.engine
            # 1) Wait for the engine to load (a promoted standby is READY already).
            if self.state is not EngineState.READY:
                try:
                    await engine.ready.remote()
                except Exception as e:  # noqa: BLE001 - a start that failed: give up, loudly
                    if died_at is None or not isinstance(e, ActorDiedError):
                        self._fail(f"engine failed to start ({_brief(e)})")
                        return
                    died_at = time.monotonic()  # killed while it loaded: another death
                    if not self._replace(_brief(e), died_at):
                        return
                    continue
                self.load_s = time.monotonic() - self._created
                if died_at is not None:
                    self.last_failover_s = time.monotonic() - died_at
                    logger.info("%s: new engine ready %.1f s after the old one died",
                                self.stage, self.last_failover_s)
                    if self.metrics is not None:
                        self.metrics.on_failover(self.stage, "restarted")
                self._set(EngineState.READY, None)
            died_at = None
            self._keep_a_standby()  # created only now: never two loads on a GPU at once
            # 2) Watch it: the lifeline call ends only when the engine is gone or broken.
            why, alive = await self._watch(engine, ActorDiedError, RayActorError)
            if alive:  # its step loop died, the process did not: end it
                _kill(engine)
            if self.engine is not engine:  # report_death promoted the standby already
                continue
            if self._renewing is not None:  # renew() ended it: a new engine, not a death
                logger.info("%s: engine replaced (%s); the new one loads", self.stage,
                            self._renewing)
                self._renewing = None
                self.renewals += 1
                self._created = time.monotonic()
                self.engine = self._create()
                continue
            # 3) Replace it (its standby, or a new engine), unless engines died too often.
            died_at = time.monotonic()
            if not self._replace(why, died_at):
                return

    def _replace(self, why: str, died_at: float) -> bool:
        """The active engine died at ``died_at``: promote the standby, or start a new engine.
        False when over the restart budget (FAILED)."""
        if not self._may_restart(died_at):
            self._fail(f"engine died ({why}); {len(self._deaths)} deaths in "
                       f"{self.policy.window_s:.0f} s, over engine_restart.max_restarts="
                       f"{self.policy.max_restarts}")
            return False
        self.restarts += 1
        standby, loaded, warmups = self._take_standby()
        if standby is not None and loaded:
            self.engine, self.load_s = standby, self._standby_load_s
            self.promotions += 1
            self.last_failover_s = time.monotonic() - died_at
            self._set(EngineState.READY, None)
            logger.warning("%s: engine died (%s); its standby (%s, %d warm-up requests) took "
                           "over in %.3f s", self.stage, why, "warm" if warmups else "cold",
                           warmups, self.last_failover_s)
            if self.metrics is not None:
                self.metrics.on_failover(self.stage, "promoted")
            if self._task is not None:  # (the watch task: start the next standby now)
                self._keep_a_standby()
            return True
        self._set(EngineState.RESTARTING, f"engine died ({why}); restarting it")
        if standby is not None:  # still loading: it is the new engine, with a head start
            logger.warning("%s: engine died (%s); its standby, still loading, takes over",
                           self.stage, why)
            self.engine, self._created = standby, self._standby_created
        else:
            logger.warning("%s: engine died (%s); starting a new one", self.stage, why)
            self._created = time.monotonic()
            self.engine = self._create()
        return True

    # -- the standby ------------------------------------------------------------------------------
    def _keep_a_standby(self) -> None:
        """Start making a standby unless one exists or is being made (needs the event loop)."""
        if not self.policy.standby or self.state is not EngineState.READY:
            return
        if self._standby_task is None or self._standby_task.done():
            if "given up" in self.standby_state or "failed" in self.standby_state:
                return
            self._standby_task = asyncio.get_running_loop().create_task(self._run_standby())

    def _take_standby(self):
        """Stop watching the standby and hand it over: (handle or None, loaded, warm-ups)."""
        standby, loaded, warmups = self.standby, self.standby_loaded, self.standby_warmups
        if self._standby_task is not None:
            self._standby_task.cancel()
            self._standby_task = None
        self.standby, self.standby_loaded, self.standby_warmups = None, False, 0
        if self.policy.standby:
            self.standby_state = "waiting for the active engine"
        self._standby_metric()
        return standby, loaded, warmups

    async def _run_standby(self) -> None:
        from ray.exceptions import ActorDiedError, RayActorError

        standby = None
        try:
            while True:
                self._standby_created = time.monotonic()
                self.standby_loaded, self.standby_warmups = False, 0
                self.standby_state = "loading"
                self.standby = standby = self._create()
                try:
                    await standby.ready.remote()
                except ActorDiedError as e:  # killed while it loaded (or its load failed)
                    why = _brief(e)
                else:
                    self._standby_load_s = time.monotonic() - self._standby_created
                    self.standby_loaded, self.standby_state = True, "loaded"
                    self._standby_metric()
                    logger.info("%s: standby engine loaded in %.1f s", self.stage,
                                self._standby_load_s)
                    why, alive = await self._watch(standby, ActorDiedError, RayActorError)
                    if alive:
                        _kill(standby)
                self.standby, self.standby_loaded, standby = None, False, None
                self._standby_metric()
                if not self._may_restart(time.monotonic()):
                    self.standby_state = (f"given up: the standby died ({why}); over "
                                          f"engine_restart.max_restarts={self.policy.max_restarts}")
                    logger.error("%s: %s", self.stage, self.standby_state)
                    return
                self.standby_restarts += 1
                logger.warning("%s: standby engine died (%s); starting a new one", self.stage, why)
        except asyncio.CancelledError:  # promoted (or taken over while loading)
            raise
        except Exception as e:  # noqa: BLE001 - the active engine keeps serving
            if standby is not None:
                _kill(standby)
            self.standby, self.standby_loaded = None, False
            self.standby_state = f"failed ({_brief(e)})"
            self._standby_metric()
            logger.error("%s: standby engine %s", self.stage, self.standby_state)

    def _standby_metric(self) -> None:
        if self.metrics is not None and self.policy.standby:
            self.metrics.set_standby_ready(self.stage, self.standby_loaded)

    async def _watch(self, engine, died, actor_error) -> tuple[str, bool]:
        """Until the engine is gone: (why, whether its process is still alive)."""
        while True:
            try:
                loop_error = await engine.lifeline.remote()
                return f"step loop died: {loop_error}", True
            except died as e:
                return type(e).__name__, False
            except actor_error as e:  # unreachable for a moment (not dead): ask again
                logger.warning("%s: engine unreachable (%s)", self.stage, _brief(e))
                await asyncio.sleep(0.5)

    def _may_restart(self, now: float) -> bool:
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.policy.window_s:
            self._deaths.popleft()
        return len(self._deaths) <= self.policy.max_restarts

    def _set(self, state: EngineState, reason: str | None) -> None:
        self.state, self.reason = state, reason
        if state is EngineState.READY:
            self._ready.set()
        else:
            self._ready.clear()

    def _fail(self, reason: str) -> None:
        logger.error("%s: %s", self.stage, reason)
        self._set(EngineState.FAILED, reason)
        if self._standby_task is not None:
            self._standby_task.cancel()


def _kill(engine) -> None:
    import ray

    try:
        ray.kill(engine, no_restart=True)
    except Exception:  # noqa: BLE001
        pass


def _brief(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__
