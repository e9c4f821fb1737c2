"""Soak, quick variant (about a minute): 5 streaming clients on the session's async_chunk app,
some leaving at random (seeded) moments. Every finished answer equals its prompt's alone answer
(text equal, audio length equal); afterwards no stage holds per-request state and the object
store's used memory is back within 2 MiB of where it started. The long variant:
``.venv/bin/python -m benchmarks.soak --minutes N`` (same code, its own local cluster).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root holds benchmarks/

from benchmarks.soak import soak  # noqa: E402

pytestmark = pytest.mark.slow

SECONDS, CLIENTS, ABORT_RATE, SEED = 45, 5, 0.3, 0


def test_soak_quick(serve_urls):
    rep = soak(serve_urls["async_chunk"], seconds=SECONDS, clients=CLIENTS,
               abort_rate=ABORT_RATE, seed=SEED)
    print("\n" + rep.summary())
    assert rep.completed >= CLIENTS and rep.aborted >= 1, rep.summary()
    assert not rep.errors, rep.errors[:5]
    assert not rep.mismatches, rep.mismatches[:5]
    assert rep.busy_after == {}, rep.busy_after
    assert rep.store_used_after <= rep.store_used_before + rep.store_margin, rep.summary()
