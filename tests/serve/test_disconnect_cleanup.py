"""No disconnect timing leaves request state in any stage or runner (issue 18, item 10).

Clients leave at random moments, from before the request is parsed to mid-audio: raw sockets
closed (some with a reset) after a random 0-0.5 s, and httpx streams closed after a random
number of events. Afterwards every table of every stage (engine requests, runner requests,
unacknowledged pushes, held chunks) must be empty within 10 s, and the app must still answer.
The disaggregated-thinker app gets the same in test_kv_disagg_state.py.
"""

from __future__ import annotations

import time

import pytest
from serve_helpers import body, busy_stages, disconnect_storm, run_alone, stats, wait_clean

pytestmark = pytest.mark.slow

ROUNDS, PER_ROUND = 25, 10  # 25 * (10 raw sockets + 2 httpx streams) = 300 disconnects


def leaving_body(rng, label: str) -> dict:
    return body(f"Leave {label}", audio=rng.random() < 0.8, max_tokens=rng.randint(4, 40),
                frames=rng.randint(8, 80))


def test_random_disconnects_leave_no_state(serve_urls):
    url = serve_urls["async_chunk"]
    before = stats(url)
    t0 = time.monotonic()
    n = disconnect_storm(url, leaving_body, ROUNDS, PER_ROUND)
    took = time.monotonic() - t0
    busy = wait_clean(url, 10)
    assert busy == {}, f"state left 10 s after {n} disconnects: {busy}"
    after = stats(url)
    aborts = {k: after[k]["aborts"] - before[k]["aborts"] for k in after}
    print(f"\n{n} disconnects in {took:.0f}s; aborts per stage {aborts}")
    assert busy_stages(after) == {}
    run_alone(url, body("Still there?", max_tokens=6, frames=12))  # the app still answers
