"""``POST /debug/engines``: a running app's stage gets a new engine under other MPS settings
(``engine_resources.mps_*``), the other stages keep theirs, answers stay the offline pipeline's,
and a bad stage, field or value is a 400 naming it that changes nothing. (On CPU MPS ignores the
variables; what is checked is that the new engine process has them: the GPU run's
``engines' MPS settings`` line checks the same there.)"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from chat_helpers import ask, offline_answer

pytestmark = pytest.mark.slow

LOW = {"mps_sm_percent": 30, "mps_low_priority": True}
BASE = {"mps_sm_percent": None, "mps_low_priority": False}


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/debug/stats", timeout=120).json()


def _renew(url: str, changes: dict) -> httpx.Response:
    return httpx.post(f"{url}/debug/engines", json=changes, timeout=600)


@pytest.mark.parametrize("changes, param", [
    ({"vocoder": LOW}, "stage"),
    ({"code2wav": {"num_gpus": 1}}, "code2wav.num_gpus"),
    ({"code2wav": {"mps_sm_percent": 0}}, "code2wav.mps_sm_percent"),
    ({"talker": {"mps_low_priority": True}, "code2wav": {"mps_sm_percent": 101}},
     "code2wav.mps_sm_percent"),
], ids=["unknown-stage", "not-an-mps-field", "share-zero", "second-stage-bad"])
def test_bad_changes_are_400_naming_them_and_change_nothing(serve_urls, changes, param):
    url = serve_urls["async_chunk"]
    before = _stats(url)
    r = _renew(url, changes)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    after = _stats(url)
    for stage in ("thinker", "talker", "code2wav"):
        assert after[stage]["actor_id"] == before[stage]["actor_id"], stage


def test_a_stage_gets_a_new_engine_under_its_new_mps_settings(serve_urls, offline):
    url = serve_urls["async_chunk"]
    before = _stats(url)
    try:
        r = _renew(url, {"code2wav": LOW})
        assert r.status_code == 200, r.text
        (rep,) = r.json()["code2wav"].values()  # the one replica
        assert rep["renewed"] is True and rep["seconds"] > 0
        want = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30", "CUDA_MPS_CLIENT_PRIORITY": "1"}
        assert rep["mps"] == want
        after = _stats(url)
        assert after["code2wav"]["mps"] == want
        assert after["code2wav"]["actor_id"] != before["code2wav"]["actor_id"]
        assert after["code2wav"]["engine_renewals"] == before["code2wav"]["engine_renewals"] + 1
        assert after["code2wav"]["engine_restarts"] == before["code2wav"]["engine_restarts"]
        for stage in ("thinker", "talker"):  # kept
            assert after[stage]["actor_id"] == before[stage]["actor_id"], stage
        # the same settings again: nothing to do
        (rep,) = _renew(url, {"code2wav": LOW}).json()["code2wav"].values()
        assert rep["renewed"] is False and _stats(url)["code2wav"]["actor_id"] == \
            after["code2wav"]["actor_id"]
        text, pcm, _, _ = ask(url)  # the new engine answers as the old one did
        ref_text, ref_pcm = offline_answer(offline["async_chunk"])
        assert text == ref_text
        assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1
    finally:  # the session's app as it was, for the tests after this one
        r = _renew(url, {"code2wav": BASE})
        assert r.status_code == 200, r.text
    assert _stats(url)["code2wav"]["mps"] == {}
