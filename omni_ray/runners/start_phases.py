"""How long each part of a runner's start took: ``/debug/stats``' ``start_phases``, printed by
gpu_check. On a fresh GPU machine a stage starts in minutes (vLLM's compilation and graph
capture, Triton and FlashInfer JIT, our own warm-ups and graphs); this says which part."""

from __future__ import annotations

import time
from contextlib import contextmanager


class StartPhases(dict):
    """name -> seconds (rounded to 10 ms)."""

    @contextmanager
    def timed(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self[name] = round(self.get(name, 0.0) + time.perf_counter() - t0, 2)
