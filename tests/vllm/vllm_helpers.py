"""Helpers shared by the vLLM test modules (one engine per module, shared by its tests)."""

from __future__ import annotations


def idle_runner(runner):
    """A fixture body: hand out a module's shared runner idle, and clear what a test left."""
    assert not runner.has_unfinished(), "a previous test left requests in the shared engine"
    yield runner
    for rid in runner.request_ids():
        runner.abort(rid)
