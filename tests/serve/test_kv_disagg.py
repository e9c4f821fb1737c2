"""Thinker prefill/decode disaggregation over real Ray Serve and HTTP (tiny checkpoint).

The reference answers come from the same app without disaggregation (``omni-kv-ref``, deleted
once they are taken); ``omni-kv`` (route ``/kv``) then runs ThinkerPrefill + ThinkerDecode with
``fallback: local_prefill``; the ``fallback: error`` policy is driven with the same deployments
through a ``DisaggPipelineClient`` built in the test process. Every test checks the answer (or the
error) and then that no stage, engine or ingress holds anything of the request any more: no
per-request entries, no held or staged KV, no live object-store copy, no ingress ref.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
import wave

import httpx
import numpy as np
import pytest
from serve_helpers import wait_ready

pytestmark = pytest.mark.slow

APP, PREFIX, REF_PREFIX, MODEL = "omni-kv", "/kv", "/kv-ref", "qwen3-omni"
PROMPT = "Hello there, how are you?"
TIMEOUTS = {"prefill_s": 20.0, "transfer_s": 3.0, "load_s": 10.0}
STATES = ["REQUESTED", "HELD", "EXTRACTED", "TRANSFERRED", "LOADED", "RELEASED"]
# Which state each failure happens in (the transfer's ``failed_at``).
FAILURES = {"prefill_dies": "HELD", "extract_fails": "HELD", "transfer_timeout": "EXTRACTED",
            "load_fails": "TRANSFERRED"}
BUSY_KEYS = ("requests", "runner_requests", "senders_in_flight", "held_chunks", "kv_held",
             "kv_waiting", "kv_refs_owned", "kv_transfers_live", "kv_refs_held")


@pytest.fixture(scope="module")
def serve_port(ray_cluster, get_free_port):
    """Serve's HTTP port: the session's when another module started Serve, else this module's
    own, shut down afterwards (a later module's ``serve.start`` would not get its port)."""
    from ray import serve
    from ray.serve.context import _get_global_client

    started = _get_global_client(raise_if_no_controller_running=False) is None
    if started:
        serve.start(http_options={"host": "127.0.0.1", "port": get_free_port()})
    yield _get_global_client().http_config.port
    if started:
        serve.shutdown()


def _args(model_dir: str, **over) -> dict:
    return {"model": model_dir, "model_id": MODEL, "pipeline": {"mode": "async_chunk"},
            "limits": {"max_prompt_tokens": 512, "default_max_audio_frames": 60},
            "security": {"enable_debug_endpoints": True, "allow_fault_injection": True}, **over}


@pytest.fixture(scope="module")
def reference(serve_port, tiny_model_dir):
    """Non-disaggregated answers from the same app without ``thinker_disaggregation`` (deleted
    before the disaggregated one starts: one set of engines at a time on a small machine)."""
    from ray import serve

    from omni_ray import build_omni_app

    serve.run(build_omni_app(_args(tiny_model_dir)), name=f"{APP}-ref", route_prefix=REF_PREFIX)
    url = wait_ready(f"http://127.0.0.1:{serve_port}{REF_PREFIX}")
    try:
        return {(m, stream): ask(url, m, stream)
                for m in (("text", "audio"), ("text",)) for stream in (False, True)}
    finally:
        serve.delete(f"{APP}-ref")


@pytest.fixture(scope="module")
def kv_url(serve_port, reference, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    disagg = {"timeouts": TIMEOUTS, "fallback": "local_prefill",
              # a killed prefill engine fails the replica's health check within a second
              "prefill": {"deployment_config": {"health_check_period_s": 1}}}
    serve.run(build_omni_app(_args(tiny_model_dir, thinker_disaggregation=disagg)),
              name=APP, route_prefix=PREFIX)
    yield wait_ready(f"http://127.0.0.1:{serve_port}{PREFIX}")
    serve.delete(APP)


# -- helpers ---------------------------------------------------------------------------------------
def body(modalities=("text", "audio"), stream=False) -> dict:
    b = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
         "modalities": list(modalities), "max_tokens": 16, "max_audio_frames": 40,
         "stream": stream}
    if "audio" in modalities:
        b["audio"] = {"voice": "chelsie", "format": "pcm16" if stream else "wav"}
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def ask(url, modalities=("text", "audio"), stream=False, fault=None):
    """(text, pcm16 array or None, completion_tokens) of one answer; asserts 200."""
    headers = {"x-omni-kv-fault": fault} if fault else {}
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body(modalities), headers=headers,
                       timeout=120)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        pcm = None
        if msg.get("audio"):
            with wave.open(io.BytesIO(base64.b64decode(msg["audio"]["data"]))) as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return msg["content"], pcm, r.json()["usage"]["completion_tokens"]
    import json

    text, pcm, usage = [], [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body(modalities, True),
                      headers=headers, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            assert "error" not in ev, ev
            usage = ev.get("usage") or usage
            for ch in ev.get("choices", []):
                d = ch["delta"]
                text.append(d.get("content") or "")
                if d.get("audio", {}).get("data"):
                    pcm.append(np.frombuffer(base64.b64decode(d["audio"]["data"]), dtype="<i2"))
    return "".join(text), (np.concatenate(pcm) if pcm else None), usage["completion_tokens"]


def same_answer(got, want):
    assert got[0] == want[0] and got[2] == want[2]
    if want[1] is None:
        assert got[1] is None
    else:
        assert got[1] is not None and np.array_equal(got[1], want[1])


def stats(url) -> dict:
    r = httpx.get(f"{url}/debug/stats", timeout=30)
    r.raise_for_status()
    return r.json()


def wait_clean(url, deadline_s=10.0) -> dict:
    """Poll until nothing anywhere holds per-request state, KV or refs; returns what is busy."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            busy = {f"{stage}.{k}": v for stage, s in stats(url).items() for k, v in s.items()
                    if k in BUSY_KEYS and v}
        except httpx.HTTPError as e:  # a replaced replica may answer errors for a moment
            busy = {"stats": repr(e)}
        if not busy or time.monotonic() > end:
            return busy
        time.sleep(0.1)


def kv_counts(url, deadline_s=120.0) -> dict:
    """The ingress's KV counters (retried while a replaced replica makes /debug/stats fail)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return {k: v for k, v in stats(url)["kv_ingress"].items() if k.startswith("kv_")}
        except httpx.HTTPError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def wait_prefill_healthy(url, deadline_s=120.0) -> None:
    """After a killed prefill engine: until a request hands off through prefill again."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        before = kv_counts(url)
        r = httpx.post(f"{url}/v1/chat/completions", json=body(("text",)), timeout=60)
        if r.status_code == 200 and kv_counts(url)["kv_released"] == before["kv_released"] + 1:
            return
        time.sleep(1.0)
    raise AssertionError("the prefill deployment did not recover")


# -- the promise: same answer ----------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("modalities", [("text", "audio"), ("text",)], ids=["audio", "text"])
def test_disaggregated_answer_equals_non_disaggregated(kv_url, reference, modalities, stream):
    before = kv_counts(kv_url)
    got = ask(kv_url, modalities, stream)
    same_answer(got, reference[(modalities, stream)])
    after = kv_counts(kv_url)
    assert after["kv_released"] == before["kv_released"] + 1  # it really went through a hand-off
    assert after["kv_fallbacks"] == before["kv_fallbacks"]
    assert wait_clean(kv_url) == {}


def test_transfer_is_reported(kv_url):
    ask(kv_url, ("text",))
    s = stats(kv_url)
    assert "thinker_prefill" in s and s["thinker"]["stage"] == "thinker_decode"
    assert s["thinker_prefill"]["kv_saves"] >= 1 and s["thinker"]["kv_loads"] >= 1
    assert s["thinker"]["kv_bytes_in"] == s["thinker_prefill"]["kv_bytes_out"] > 0


# -- failures: fallback to a local prefill gives the same answer ----------------------------------
@pytest.mark.parametrize("fault", list(FAILURES))
def test_failure_falls_back_to_local_prefill(kv_url, reference, fault):
    before = kv_counts(kv_url)
    got = ask(kv_url, fault=fault)
    same_answer(got, reference[(("text", "audio"), False)])
    after = kv_counts(kv_url)
    assert after["kv_failed"] == before["kv_failed"] + 1
    assert after["kv_fallbacks"] == before["kv_fallbacks"] + 1
    if fault == "prefill_dies":  # Serve replaces the replica whose engine died
        wait_prefill_healthy(kv_url)
    assert wait_clean(kv_url) == {}


# -- aborts: one per lifecycle state ---------------------------------------------------------------
@pytest.mark.parametrize("state", STATES)
def test_abort_at_each_state_releases_everything(kv_url, reference, state):
    before = kv_counts(kv_url)
    r = httpx.post(f"{kv_url}/v1/chat/completions", json=body(),
                   headers={"x-omni-kv-fault": f"abort_at:{state}"}, timeout=120)
    assert r.status_code == 500, r.text
    assert f"aborted at {state}" in r.json()["error"]["message"]
    after = kv_counts(kv_url)
    if state == "RELEASED":  # the hand-off had finished; the request itself was aborted
        assert after["kv_released"] == before["kv_released"] + 1
    else:
        assert after["kv_aborted"] == before["kv_aborted"] + 1
    assert wait_clean(kv_url) == {}
    same_answer(ask(kv_url), reference[(("text", "audio"), False)])  # and the app is fine after


def test_bad_kv_fault_header_is_400(kv_url):
    r = httpx.post(f"{kv_url}/v1/chat/completions", json=body(),
                   headers={"x-omni-kv-fault": "abort_at:NEVER"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-omni-kv-fault"


# -- failures with ``fallback: error``: a clear error, nothing left ---------------------------------
@pytest.mark.parametrize("fault", list(FAILURES))
def test_failure_with_error_policy_ends_the_request(kv_url, tiny_model_dir, fault):
    from ray import serve

    from omni_ray.config.request import OmniRequest
    from omni_ray.config.serving import ThinkerDisaggConfig
    from omni_ray.ingress.kv_client import DisaggPipelineClient
    from omni_ray.ingress.pipeline_client import StageError
    from omni_ray.testing.faults import KVFault
    from omni_ray.models.tokenizer import encode_chat, load_tokenizer

    h = {s: serve.get_deployment_handle(f"{s}:{MODEL}", app_name=APP)
         for s in ("ThinkerPrefill", "ThinkerDecode", "Talker", "Code2Wav")}
    cfg = ThinkerDisaggConfig(timeouts=TIMEOUTS, fallback="error")
    ids = encode_chat(load_tokenizer(tiny_model_dir), [{"role": "user", "content": PROMPT}])
    req = OmniRequest(request_id=f"err-{fault}", prompt_token_ids=ids, max_tokens=16,
                      max_audio_frames=40, speaker="chelsie")

    async def run():
        client = DisaggPipelineClient(h["ThinkerPrefill"], h["ThinkerDecode"], h["Talker"],
                                      h["Code2Wav"], cfg)
        with pytest.raises(StageError) as err:
            await client.open(req, kv_fault=KVFault.parse(fault))
        return client, err.value

    client, err = asyncio.run(run())
    assert err.stage == "thinker"
    assert f"KV hand-off failed at {FAILURES[fault]}" in str(err)
    s = client.stats()
    assert (s["kv_transfers_live"], s["kv_refs_held"], s["kv_failed"], s["kv_fallbacks"]) == \
        (0, 0, 1, 0)
    if fault == "prefill_dies":
        wait_prefill_healthy(kv_url)
    assert wait_clean(kv_url) == {}


def test_media_input_is_refused_with_a_400_naming_why(kv_url):
    """Audio/image prompts are not disaggregated yet: a clear 400, not a half-served request."""
    from media_samples import b64, audio_bytes, tone

    part = {"type": "input_audio", "input_audio": {"data": b64(audio_bytes(tone(0.5))),
                                                   "format": "wav"}}
    r = httpx.post(f"{kv_url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_content" and "disaggregation" in err["message"]
    assert err["param"] == "messages.0.content.0.type"
