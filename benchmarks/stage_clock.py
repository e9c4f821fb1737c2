"""Time a pipeline's stages from the outside, by wrapping methods (no library code edited).

``clock.wrap(omni.thinker, "step", "thinker.step")`` replaces the instance's bound method with a
timed one; every call appends a (start, end) span under that name. ``totals()`` sums the spans,
optionally only those that ended by a given time (e.g. the first audio packet), so a latency can
be split into the stages that produced it.
"""

from __future__ import annotations

import time
from collections import defaultdict


class StageClock:
    def __init__(self):
        self.spans: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def wrap(self, obj, attr: str, name: str) -> None:
        """Time every call of ``obj.attr`` under ``name`` (an instance attribute shadows it)."""
        fn = getattr(obj, attr)
        setattr(obj, attr, self.timed(fn, name))

    def timed(self, fn, name: str):
        spans = self.spans[name]

        def timed_call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spans.append((t0, time.perf_counter()))

        timed_call.__wrapped__ = fn
        return timed_call

    def reset(self) -> None:
        for spans in self.spans.values():
            spans.clear()

    def totals(self, until: float | None = None) -> dict[str, float]:
        """Seconds per name, over spans that ended by ``until`` (all spans when None)."""
        return {name: sum(e - s for s, e in spans if until is None or e <= until)
                for name, spans in self.spans.items()}

    def counts(self) -> dict[str, int]:
        return {name: len(spans) for name, spans in self.spans.items()}
