"""The ingress aborts a request in its stages' engines itself when the request ends before its
stages do, without relying on Serve's cancel of the stage calls, which can be lost: a stage
replica then streams its request for ever (the talker waiting for a thinker chunk that never
comes; benchmarks/serve_cancel_race.py).

Where a stage call's first item (its engine) has come, the abort goes to that engine. Where it
has not, the engine that holds (or will hold) the request is unknown: the abort goes to every
engine of that stage the ingress saw lately (``StageReach``: a stage of several replicas) and
through the stage's deployment (a replica not seen yet). An abort of a finished request does
nothing; of one an engine does not know, it refuses a late add (stages/tombstones.py), so an
engine that never gets the request keeps a bounded, expiring record and nothing else.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

RECENT_S = 600.0  # an engine not named by any call for this long is left out (restarted, gone)
KEEP = 16  # engines remembered per stage
ABORT_TIMEOUT_S = 30.0

_BACKGROUND: set = set()  # the aborts awaited in the background, kept until done


class StageReach:
    """Each stage's deployment handle and the engines its calls named lately."""

    def __init__(self, handles: dict, recent_s: float = RECENT_S, keep: int = KEEP):
        self.handles = handles
        self.recent_s, self.keep = recent_s, keep
        self._seen: dict[str, OrderedDict] = {}  # stage -> engine handle -> time last named

    def note(self, engines: dict) -> None:
        """Remember the engines a request's calls named (``None``: a call that failed)."""
        now = time.monotonic()
        for name, engine in engines.items():
            if engine is None:
                continue
            seen = self._seen.setdefault(name, OrderedDict())
            seen[engine] = now
            seen.move_to_end(engine)
            while len(seen) > self.keep:
                seen.popitem(last=False)

    def recent(self, name: str) -> list:
        """The engines of stage ``name`` named within ``recent_s``."""
        limit = time.monotonic() - self.recent_s
        return [e for e, t in self._seen.get(name, {}).items() if t >= limit]


def abort_stages(rid: str, gens: list, engines: dict, reach: StageReach) -> None:
    """Abort ``rid`` in the engines of the stages in ``gens`` (``(stage, call)`` pairs):
    directly on the engine ``engines`` names for a stage; for a stage whose call named none yet,
    on each engine ``reach`` saw lately and through its deployment; nowhere for a stage whose call
    failed (``engines[name] is None``: it ended there, and a refusal under load is not answered
    with more calls). The calls not on a named engine run in the background, on the running loop
    (none: skipped)."""
    for name, _ in gens:
        if name in engines:
            if engines[name] is not None:
                engines[name].abort.remote(rid)
            continue
        loop = _loop()
        handle = reach.handles.get(name)
        if loop is None or handle is None:
            continue
        for engine in reach.recent(name):
            _background(loop, lambda e=engine: e.abort.remote(rid))
        _background(loop, lambda h=handle: h.abort.remote(rid))


def _background(loop: asyncio.AbstractEventLoop, call) -> None:
    task = loop.create_task(_quietly(call))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _quietly(call) -> None:
    try:
        await asyncio.wait_for(call(), ABORT_TIMEOUT_S)
    except BaseException:  # noqa: BLE001 - best effort: a gone engine has nothing to abort
        pass


def _loop() -> asyncio.AbstractEventLoop | None:
    """The running loop; None outside one (a ``PipelineStream`` collected off the loop)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
