"""Status lines on stderr for the slow steps of the CLI (making a checkpoint, loading the model,
generating).

Shown when stderr is a terminal, or always with ``--progress``; never with ``--quiet``. On a
terminal a step's line is rewritten in place with the time it has taken so far (no percentage:
the pipeline does not know how long an answer will be), and ends ``... done (1.2 s)``. Forced
into a file or pipe, each step is two plain lines, its start and its end, so logs stay readable.
Warnings (random weights, ...) are not status: they are printed either way.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

AUTO, ALWAYS, NEVER = "auto", "always", "never"
TICK_S = 0.2  # how often a terminal's status line is rewritten


def add_progress_flags(p) -> None:
    """``--quiet`` / ``--progress`` (default: status lines when stderr is a terminal)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", dest="progress", action="store_const", const=NEVER, default=AUTO,
                   help="no status lines on stderr (warnings still print)")
    g.add_argument("--progress", dest="progress", action="store_const", const=ALWAYS,
                   help="status lines on stderr even when it is not a terminal")


class Progress:
    """Status lines for one command; ``step(what)`` is a context manager around a slow step."""

    def __init__(self, mode: str = AUTO, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        self.enabled = mode == ALWAYS or (mode == AUTO and self.tty)

    @classmethod
    def from_args(cls, args) -> "Progress":
        return cls(getattr(args, "progress", AUTO))

    def note(self, line: str) -> None:
        """One status line (nothing when quiet)."""
        if self.enabled:
            self._write(f"{line}\n")

    @contextmanager
    def step(self, what: str):
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        stop = threading.Event()
        ticker = None
        if self.tty:  # rewrite the line in place while the step runs
            def tick():
                while not stop.wait(TICK_S):
                    self._write(f"\r{what} ... {time.perf_counter() - t0:.1f} s\x1b[K")

            self._write(f"{what} ...")
            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
        else:
            self._write(f"{what} ...\n")
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            took = time.perf_counter() - t0
            end = "done" if ok else "failed"
            self._write(f"\r{what} ... {end} ({took:.1f} s)\x1b[K\n" if self.tty
                        else f"{what}: {end} ({took:.1f} s)\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False
