"""Errors that cross a process boundary (picklable: every argument lands in ``args``)."""

from __future__ import annotations


class EngineUnavailable(Exception):
    """A stage replica has no engine that can take a request now (its engine died and a new one
    is starting). Raised before any output; the ingress answers 503 + ``Retry-After``."""

    def __init__(self, stage: str, reason: str, retry_after_s: int = 1):
        super().__init__(stage, reason, retry_after_s)
        self.stage, self.reason, self.retry_after_s = stage, reason, retry_after_s

    def __str__(self) -> str:
        return f"{self.stage} engine unavailable: {self.reason}"
