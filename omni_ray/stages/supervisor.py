"""Keeps a stage replica's engine actor alive: ``EngineSupervisor``.

The replica's engine actor is created and watched here. One call to the engine's ``lifeline``
is always pending; it fails the moment the actor's process dies (or returns when its step loop
dies), and the supervisor then starts a new engine in the same replica at once (its model loads
again, on a GPU in its start turn: stages/gpu_start.py).
Meanwhile ``engine_for_request`` refuses with ``EngineUnavailable`` (the ingress answers 503 +
``Retry-After``) and ``reason`` says why. Past ``max_restarts`` deaths within ``window_s``, or
when an engine fails to start, the state is FAILED: the replica's ``check_health`` fails and
Serve replaces the whole replica.
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
    def __init__(self, stage: str, create: Callable[[], object], policy: EngineRestartConfig):
        """``create()`` makes a new engine actor (its handle)."""
        self.stage, self.policy = stage, policy
        self._create = create
        self._created = time.monotonic()
        self.engine = create()
        self.state = EngineState.STARTING
        self.reason = "engine loading"
        self.restarts = 0
        self.last_failover_s: float | None = None  # death -> new engine ready, the latest one
        self.load_s: float | None = None  # the current engine's creation -> ready
        self._deaths: deque[float] = deque()
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()  # set while READY

    # -- what the replica asks ------------------------------------------------------------------
    def start(self) -> None:
        """Start watching (idempotent; needs the replica's event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    def engine_for_request(self):
        """The engine to give a new request, or ``EngineUnavailable`` when there is none."""
        self.start()
        if self.state is not EngineState.READY:
            raise EngineUnavailable(self.stage, self.reason, self.policy.retry_after_s)
        return self.engine

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

    def report_death(self, engine, why: str) -> None:
        """A call on ``engine`` found it dead: stop giving it out now (the watch restarts it)."""
        if engine is self.engine and self.state is EngineState.READY:
            self._set(EngineState.RESTARTING, f"engine died ({why}); restarting it")

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
            # 1) Wait for the engine to load.
            try:
                await engine.ready.remote()
                self.load_s = time.monotonic() - self._created
            except Exception as e:  # noqa: BLE001 - a start that failed: give up, loudly
                if died_at is None or not isinstance(e, ActorDiedError):
                    self._fail(f"engine failed to start ({_brief(e)})")
                    return
                why = _brief(e)  # killed while it loaded: counts as another death
            else:
                if died_at is not None:
                    self.last_failover_s = time.monotonic() - died_at
                    logger.info("%s: new engine ready %.1f s after the old one died",
                                self.stage, self.last_failover_s)
                self._set(EngineState.READY, None)
                # 2) Watch it: the lifeline call ends only when the engine is gone or broken.
                why, alive = await self._watch(engine, ActorDiedError, RayActorError)
                if alive:  # its step loop died, the process did not: end it
                    _kill(engine)
            died_at = time.monotonic()
            # 3) Restart, unless this engine died too often.
            if not self._may_restart(died_at):
                self._fail(f"engine died ({why}); {len(self._deaths)} deaths in "
                           f"{self.policy.window_s:.0f} s, over engine_restart.max_restarts="
                           f"{self.policy.max_restarts}")
                return
            self._set(EngineState.RESTARTING, f"engine died ({why}); restarting it")
            logger.warning("%s: engine died (%s); starting a new one", self.stage, why)
            self.restarts += 1
            self._created = time.monotonic()
            self.engine = self._create()

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


def _kill(engine) -> None:
    import ray

    try:
        ray.kill(engine, no_restart=True)
    except Exception:  # noqa: BLE001
        pass


def _brief(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__
