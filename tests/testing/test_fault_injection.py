"""omni_ray/testing/faults.py: the one place faults are decided (the Serve paths that use them are
tests/serve/test_kv_disagg.py and tests/serve/test_lifecycle.py)."""

from __future__ import annotations

import asyncio

import pytest

from omni_ray.kv_lifecycle import KVState
from omni_ray.testing import faults
from omni_ray.testing.faults import KVFault


def test_fault_parsing():
    assert KVFault.parse("load_fails") == KVFault(kind="load_fails")
    assert KVFault.parse("abort_at:held") == KVFault(abort_at=KVState.HELD)
    assert KVFault.parse("abort_at:RELEASED").abort_at is KVState.RELEASED
    for bad in ("nope", "abort_at:FAILED", "abort_at:WHENEVER", ""):
        with pytest.raises(ValueError):
            KVFault.parse(bad)


def test_headers_are_read_only_when_allowed():
    headers = {"x-omni-fault": "talker", "x-omni-kv-fault": "load_fails"}
    assert faults.requested(headers, allowed=False) == (None, None)
    assert faults.requested(headers, allowed=True) == ("talker", "load_fails")
    assert faults.requested({}, allowed=True) == (None, None)


def test_hooks_do_nothing_without_their_fault(monkeypatch):
    monkeypatch.setattr(faults, "SAVE_LANDS_S", 0.01)
    for kind in (None, *faults.FAULT_KINDS):
        assert asyncio.run(faults.abort_unread(kind)) == (kind == "abort_unread")
        assert faults.extract_fails(kind) == (kind == "extract_fails")
        assert faults.load_fails(kind) == (kind == "load_fails")
        assert faults.transfer_delay_s(kind, 10.0) == (11.0 if kind == "transfer_timeout" else 0.0)
        if kind != "prefill_dies":
            asyncio.run(asyncio.wait_for(faults.sender_stalls(kind), 1.0))  # returns at once
            faults.kill_sender(kind, KVState.HELD, engine=None)  # kills nothing
    faults.kill_sender("prefill_dies", KVState.EXTRACTED, engine=None)  # only once HELD
