"""The engine's last steps, one record each (``GET /debug/steps``): when a step began, how long it
took, over how many rows, what it sent, and the runner's parts of it.

The stats' sums (``loop_time``, the runners' ``time_spent``) give the mean step; one step of
hundreds of ms in a burst of new requests hides in them (at c=32 the talker makes ~350 steps a
level: one 700 ms step moves its mean by 2 ms), yet it sets the first audio of every request it
holds up. This ring keeps the last ``KEEP`` steps, cheaply (a tuple and the parts that changed),
so a benchmark can ask what the steps around a slow first audio did.

A record (``since``) holds: ``t`` (wall-clock start of the step, ``time.time()``: comparable with
the request timelines of omni_ray/timeline.py), ``ms`` (the step), ``rows`` (requests stepped),
``emits`` (items it sent on: chunks to the next stage or the caller, ends, errors), ``cmds`` / ``cmds_ms`` (commands and chunks applied on the loop thread since the last step: the
adds, chunks and calls that came in between), and ``parts``: what the runner's ``time_spent``
counters grew by since the last step (``*_s`` as ms, counts as they are).
"""

from __future__ import annotations

from collections import deque

KEEP = 8192  # steps kept per engine (about 3 minutes of a talker at c=32)


class StepTrace:
    """Written by the step thread (``record``); read from the actor's loop (``since``): a deque's
    append and its copy are each one operation under the GIL."""

    def __init__(self, keep: int = KEEP):
        self._steps: deque = deque(maxlen=keep)
        self._last: dict = {}  # the runner's counters at the last record

    def baseline(self, counters: dict | None) -> None:
        """The runner's counters before the first step (its start's are no step's)."""
        self._last = dict(counters or {})

    def record(self, t: float, seconds: float, rows: int, emits: int, cmds: int, cmds_s: float,
               counters: dict | None) -> None:
        """One step: began at wall time ``t``, took ``seconds``; ``counters``: a copy of the
        runner's ``time_spent`` now, kept as the next step's base (the record keeps what grew
        since the last)."""
        parts = None
        if counters:
            last = self._last
            parts = {k: v - last.get(k, 0) for k, v in counters.items()
                     if isinstance(v, (int, float)) and v != last.get(k, 0)}
            self._last = counters  # the caller's copy: not copied again per step
        self._steps.append((t, seconds, rows, emits, cmds, cmds_s, parts))

    def since(self, t0: float = 0.0, limit: int = KEEP) -> list[dict]:
        """The steps that began at or after wall time ``t0``, the last ``limit`` of them, oldest
        first."""
        steps = [s for s in list(self._steps) if s[0] >= t0][-limit:] if limit > 0 else []
        return [dict(t=t, ms=1e3 * s, rows=rows, emits=emits, cmds=cmds, cmds_ms=1e3 * cs,
                     parts=_as_ms(parts)) for t, s, rows, emits, cmds, cs, parts in steps]

    def __len__(self) -> int:
        return len(self._steps)


def _as_ms(parts: dict | None) -> dict:
    if not parts:
        return {}
    return {(k[:-2] + "_ms" if k.endswith("_s") else k): (1e3 * v if k.endswith("_s") else v)
            for k, v in parts.items()}
