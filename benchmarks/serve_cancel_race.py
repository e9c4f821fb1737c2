"""How often Serve loses the cancel of a stage call when the caller's own request is cancelled.

The pattern of the app, without models: an ``Ingress`` deployment opens a streaming call to a
``Stage`` deployment and cancels it in ``finally``; the stage's replica adds the request to an
engine actor, claims its stream, yields once, then waits on the engine's stream (as the talker
waits for the thinker's next chunk) and aborts the engine's request when it is cancelled. The
driver cancels the ingress's calls at random moments (a client leaving), N calls in bursts of 10.

Afterwards the engine lists the requests still held: those never claimed (the real engine reaps
them after ``UNCLAIMED_S``) and those claimed and never aborted (nothing ever ends them). For each
claimed one it prints what the ingress saw (its first item or not, the exception) and how far the
stage's ``open()`` got. Session 29 (Ray 2.60, 2 cores, ``--calls 600 --runs 8``): 2 claimed and
never aborted in 8 runs. In both the stage's ``open()`` had yielded and was still waiting, no
``CancelledError`` ever raised in it, and the ingress had been cancelled before its first item:
Serve's cancel of the stage call never reached the replica. This is the talker request session
28's CI found left after the disconnect storm (benchmarks/README.md "Session 29").

``--ingress-aborts both`` alternates runs without and with the ingress aborting the engine itself
(directly when it has the call's first item, the engine; else through the stage's deployment).
Session 29, 7 runs of 600 each: claimed and never aborted 6 -> 1, added and never claimed 8-36 a
run -> 0 in six runs and 1 in the seventh.

    python -m benchmarks.serve_cancel_race --calls 600 --runs 14 --ingress-aborts both
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import ray
from ray import serve

ENGINE = "serve_cancel_race_engine"


@ray.remote
class Engine:
    def __init__(self):
        self.reqs: dict[str, asyncio.Event] = {}
        self.claimed: set[str] = set()
        self.aborts = 0

    async def add(self, rid: str) -> None:
        self.reqs[rid] = asyncio.Event()

    async def stream(self, rid: str):
        ev = self.reqs[rid]
        self.claimed.add(rid)
        try:
            yield 0
            await ev.wait()  # an upstream that never sends again
        finally:
            if rid in self.reqs:
                await self.abort(rid)

    async def abort(self, rid: str) -> bool:
        ev = self.reqs.pop(rid, None)
        if ev is None:
            return False
        self.aborts += 1
        ev.set()
        return True

    async def held(self) -> dict:
        return dict(held=len(self.reqs), claimed=sorted(r for r in self.reqs if r in self.claimed),
                    aborts=self.aborts)


def engine():
    return Engine.options(name=ENGINE, get_if_exists=True, max_concurrency=1000).remote()


@serve.deployment(max_ongoing_requests=1000)
class Stage:
    def __init__(self):
        self.engine = engine()
        self.seen: dict[str, list[str]] = {}

    async def open(self, rid: str):
        seen = self.seen[rid] = []
        try:
            await self.engine.add.remote(rid)
            gen = self.engine.stream.options(num_returns="streaming").remote(rid)
            seen.append("claimed")
            yield self.engine
            seen.append("yielded")
            async for ref in gen:
                yield await ref
        except (asyncio.CancelledError, GeneratorExit) as e:
            seen.append(type(e).__name__)
            self.engine.abort.remote(rid)
            raise

    async def seen_by(self, rids: list[str]) -> dict:
        return {r: self.seen.get(r) for r in rids}

    async def abort(self, rid: str) -> bool:
        """The request's abort through the deployment (one replica here: its engine)."""
        return await self.engine.abort.remote(rid)


@serve.deployment(max_ongoing_requests=1000)
class Ingress:
    """``aborts``: when a call ends other than by its stream's end, also abort the request in
    the stage's engine directly: at once when the call's first item (the engine) came, else
    from a background task that waits for that item (Serve's cancel may be lost)."""

    def __init__(self, stage, aborts: bool):
        self.stage, self.aborts = stage, aborts
        self.seen: dict[str, list[str]] = {}
        self.later: set[asyncio.Task] = set()

    async def run(self, rid: str) -> None:
        seen = self.seen[rid] = []
        g = self.stage.options(stream=True).open.remote(rid)
        eng, ended = None, False
        try:
            eng = await g.__anext__()
            seen.append("first")
            async for _ in g:
                pass
            ended = True
        except BaseException as e:
            seen.append(type(e).__name__)
            raise
        finally:
            if not self.aborts or ended:
                g.cancel()
            elif eng is not None:
                g.cancel()
                eng.abort.remote(rid)
            else:
                task = asyncio.get_running_loop().create_task(
                    abort_when_opened(g, rid, self.stage))
                self.later.add(task)
                task.add_done_callback(self.later.discard)

    async def seen_by(self, rids: list[str]) -> dict:
        stage = await self.stage.seen_by.remote(rids)
        return {r: dict(ingress=self.seen.get(r), stage=stage.get(r)) for r in rids}


async def abort_when_opened(g, rid: str, stage, timeout_s: float = 5.0) -> None:
    """The call's first item (its engine), then that engine's abort; the call cancelled. When
    the call gives no first item here (cancelled on this side, perhaps not on the replica's),
    the abort goes through the stage's deployment instead."""
    try:
        eng = await asyncio.wait_for(g.__anext__(), timeout_s)
        eng.abort.remote(rid)
    except BaseException:  # noqa: BLE001 - cancelled or failed here: maybe not there
        await stage.abort.remote(rid)
    finally:
        g.cancel()


async def storm(handle, calls: int, seed: int) -> None:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    pending = []
    for i in range(calls):
        call = handle.run.remote(f"r{i}")
        loop.call_later(rng.random() * 0.08, call.cancel)
        pending.append(call)
        if i % 10 == 9:
            await asyncio.sleep(rng.random() * 0.05)
    for call in pending:
        try:
            await call
        except BaseException:  # noqa: BLE001 - cancelled, as meant
            pass


def engine_here():
    """The engine the stage's replica made (named, in the replica's namespace)."""
    ns = next(a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
              if a["name"] == ENGINE)
    return ray.get_actor(ENGINE, namespace=ns)


def one_run(calls: int, seed: int, settle_s: float, aborts: bool) -> dict:
    handle = serve.run(Ingress.bind(Stage.bind(), aborts), name="cancel_race", route_prefix=None)
    asyncio.run(storm(handle, calls, seed))
    time.sleep(settle_s)
    eng = engine_here()
    out = ray.get(eng.held.remote())
    out["claimed_seen"] = handle.seen_by.remote(out["claimed"]).result()
    serve.delete("cancel_race")
    ray.kill(eng)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--settle-s", type=float, default=7.0)
    ap.add_argument("--ingress-aborts", choices=["off", "on", "both"], default="off",
                    help="the ingress also aborts the engines itself (both: alternate runs)")
    a = ap.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    arms = {"off": [False], "on": [True], "both": [False, True]}[a.ingress_aborts]
    lost = {arm: 0 for arm in arms}
    for run in range(a.runs):
        arm = arms[run % len(arms)]
        out = one_run(a.calls, run, a.settle_s, arm)
        lost[arm] += len(out["claimed"])
        print(f"run {run} (ingress aborts {'on' if arm else 'off'}): {out['held']} held "
              f"({len(out['claimed'])} claimed, never aborted), {out['aborts']} aborts; "
              f"{out['claimed_seen']}", flush=True)
    for arm, n in lost.items():
        print(f"ingress aborts {'on' if arm else 'off'}: {n} claimed and never aborted in "
              f"{sum(1 for r in range(a.runs) if arms[r % len(arms)] == arm)} runs of {a.calls}")
    serve.shutdown()


if __name__ == "__main__":
    main()
