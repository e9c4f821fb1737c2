"""Time this process spends in Python's cyclic garbage collector, for the step records.

A collection pauses every thread of the process (it holds the GIL), so one that lands inside a
step makes that step long whatever the runner did: the talker's 261 ms step at c=32 in session
20's GPU run had no part that said why. ``install`` hooks ``gc.callbacks`` once per process;
``totals`` are the running sums the stage engine adds to its runner's counters (``gc_s``, all
generations; ``gc2_s``, the full collections; ``gcs``, how many), so each step record says how
much of the step was collection (``gc_ms`` in ``GET /debug/steps``).

``freeze`` moves what the start built (weights' Python objects, compiled graphs, caches) out of
the collector's reach (``gc.freeze``), as vLLM's engine core does for its own process: a full
collection then walks only what serving allocated since.
"""

from __future__ import annotations

import gc
import time

_sums = {"gc_s": 0.0, "gc2_s": 0.0, "gcs": 0}
_started: list[float] = [0.0]


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started[0]
    _sums["gc_s"] += took
    _sums["gcs"] += 1
    if info.get("generation") == 2:
        _sums["gc2_s"] += took


def install() -> None:
    """Hook the collector (idempotent)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def totals() -> dict:
    """The sums so far: ``gc_s``, ``gc2_s`` (seconds) and ``gcs`` (collections)."""
    return dict(_sums)


def freeze() -> None:
    """Collect once, then keep everything alive now out of later collections."""
    gc.collect()
    gc.freeze()
