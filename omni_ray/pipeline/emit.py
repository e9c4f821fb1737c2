"""What a stage logic returns from a step (``Emit``), and the surface every stage logic shares.

A stage logic owns one runner and the routing of its output. It receives requests (``add``) and
upstream chunks (``on_chunk``), advances its runner (``step``) and returns ``Emit``s: chunks for
the next stage (``down``) and items for the caller (``out``: text deltas from the thinker, audio
from code2wav). It is synchronous and Ray-free: the Serve engine actor steps it on one thread
(stages/engine.py), the offline pipeline steps it in-process (pipeline/local.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_ray.config.request import OmniRequest


class StageRequestError(Exception):
    """A request failed in a stage (the others go on)."""


@dataclass
class Emit:
    request_id: str
    target: str            # "down": to the next stage; "out": to the caller's stream
    item: Any              # a payload chunk (None for a bare end of stream)
    final: bool = False    # last item on this target for this request
    error: str | None = None  # set on a request's failure; then target is "out" and final True


class StageLogic:
    """Common surface; subclasses own one runner (``self.runner``) and a ``self._fail`` set."""

    stage: str = ""
    last_batch_size: int = 0  # requests advanced by the latest step (a metric)
    runner: Any
    _fail: set[str]

    def add(self, req: OmniRequest, has_downstream: bool) -> None: ...

    def check(self, req: OmniRequest, has_downstream: bool) -> bool:
        """Refuse invalid input (ValueError) without touching request state; may run beside the
        step thread. True: ``add`` can refuse nothing more, so a caller may queue it and go on;
        False (here): only ``add`` can tell, so the caller waits for it."""
        return False
    def on_chunk(self, chunk) -> list[Emit]: return []
    def has_work(self) -> bool: return False
    def num_requests(self) -> int: return 0
    def request_ids(self) -> list[str]: return []
    def _forget(self, rid: str) -> None: ...
    def _on_output(self, out) -> list[Emit]: return []

    def tune(self, pipeline) -> None:
        """The running app's live pipeline fields (``config/pipeline.LIVE_FIELDS``) changed:
        a stage that reads one of them takes ``pipeline``'s from its next step or request."""

    def counters(self) -> dict[str, int]:
        """The stage's own counts for ``/debug/stats`` (none here)."""
        return {}

    def step(self) -> list[Emit]:
        """Injected faults, then one runner step: a failed request's output becomes its error
        emit, every other output goes to ``_on_output`` (the stage's routing)."""
        emits = [self._fault(rid) for rid in list(self._fail)]
        outs = self.runner.step()
        self.last_batch_size = len(outs)
        for out in outs:
            if out.error:
                emits.append(self._error_emit(out.request_id, out.error))
            else:
                emits.extend(self._on_output(out))
        return emits

    # Shared by every stage: fault injection, per-request errors, abort.
    def fail_next_step(self, request_id: str) -> None:
        """Tests only: the request fails at this stage's next step."""
        self._fail.add(request_id)

    def _fault(self, rid: str) -> Emit:
        return self._error_emit(rid, f"injected fault in {self.stage}")

    def _error_emit(self, rid: str, msg: str) -> Emit:
        self.runner.abort(rid)
        self._forget(rid)
        return Emit(rid, "out", None, True, error=msg)

    def abort(self, request_id: str) -> None:
        self.runner.abort(request_id)
        self._forget(request_id)
