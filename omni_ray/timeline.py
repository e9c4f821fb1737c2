"""Per-request milestones of one engine (or the ingress): where a request's first audio went.

Each engine notes, per request, the wall-clock time (``time.time()``: comparable across the
processes of one host) of the first time something happened: ``added``, ``first_in`` (the first
upstream chunk), ``first_down`` (the first chunk to the next stage), ``first_out`` (the first
text delta or audio piece to the caller); the ingress its own (``received``, ``parsed``,
``opening``, ``thinker_sent``, ``opened``, ``first_text``, ``first_audio``), each stage replica
``replica_open`` (its ``open`` call arrived). ``GET /debug/timeline`` joins them per request, and
``benchmarks/timeline.py`` splits the time to first audio into the stages and hops between.

Ray-free and torch-free; bounded: at most ``keep`` requests in flight (the oldest forgotten
past that: a request whose stream never ran) plus the last ``keep`` finished ones.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class Timeline:
    def __init__(self, keep: int = 1024):
        self.keep = keep
        self._live: dict[str, dict[str, float]] = {}
        self._done: OrderedDict[str, dict[str, float]] = OrderedDict()

    def start(self, request_id: str, name: str = "added", t: float | None = None) -> None:
        """A request begins here (marks ``name``)."""
        self._live.setdefault(request_id, {}).setdefault(name, time.time() if t is None else t)
        while len(self._live) > self.keep:
            del self._live[next(iter(self._live))]

    def mark(self, request_id: str, name: str, t: float | None = None) -> None:
        """The first ``name`` of a request begun here (later ones, and unknown ids, ignored), at
        ``t`` (default now)."""
        marks = self._live.get(request_id)
        if marks is not None and name not in marks:
            marks[name] = time.time() if t is None else t

    def finish(self, request_id: str) -> None:
        marks = self._live.pop(request_id, None)
        if marks is None:
            return
        self._done[request_id] = marks
        while len(self._done) > self.keep:
            self._done.popitem(last=False)

    def get(self, request_ids: list[str]) -> dict[str, dict[str, float]]:
        """The marks of these requests (in flight or recently finished) that are known here."""
        out = {}
        for rid in request_ids:
            marks = self._live.get(rid) or self._done.get(rid)
            if marks is not None:
                out[rid] = dict(marks)
        return out

    def recent(self, limit: int) -> list[str]:
        """The ids of the last ``limit`` finished requests, oldest first."""
        return list(self._done)[-limit:] if limit > 0 else []

    def __len__(self) -> int:
        return len(self._live)
