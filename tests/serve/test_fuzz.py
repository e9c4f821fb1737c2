"""Bad input fuzzing: schemathesis against the ingress's own ``/openapi.json``, over real HTTP.

Positive and negative cases for every operation: never a 5xx, every error body in OpenAI's
schema (``{"error": {"message", "type", "param", "code"}}``), and a 200 stream never carries an
error event. Positive chat cases are steered at three levels, so that many reach the stages
(otherwise nearly every generated body stops at "model not found"): as generated; with the served
model and a small output; and also with one user message and a known voice (every other field,
e.g. temperature, top_p, seed, stream, as generated).
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = {"POST /v1/chat/completions": 400}
DEFAULT_EXAMPLES = 20
ERROR_KEYS = {"message", "type", "param", "code"}


def steer(case, level: int, text: str):
    """Level 1: the served model and a bounded output (tokens, frames); level 2: also one user
    message (``text``) and a known voice."""
    body = case.body
    if level and isinstance(body, dict) and case.path == "/v1/chat/completions":
        body["model"] = "qwen3-omni"
        for key, cap in (("max_tokens", 4), ("max_completion_tokens", 4), ("max_audio_frames", 8)):
            v = body.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > cap:
                body[key] = cap
        body.setdefault("max_tokens", 4)
        body.setdefault("max_audio_frames", 8)
        if level == 2:
            body["messages"] = [{"role": "user", "content": text}]
            if isinstance(body.get("audio"), dict):
                body["audio"]["voice"] = "ethan"
    return case


def header(resp, name: str) -> str:
    """A header of a schemathesis (values are lists) or httpx response."""
    for k, v in resp.headers.items():
        if k.lower() == name:
            return v[0] if isinstance(v, list) else v
    return ""


def check_error_body(resp) -> None:
    try:
        err = resp.json()["error"]
    except (ValueError, KeyError, TypeError) as e:
        raise AssertionError(f"{resp.status_code} without OpenAI's error body: "
                             f"{resp.text[:300]!r}") from e
    assert set(err) == ERROR_KEYS, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err


def check_response(case, resp) -> None:
    where = f"{case.method} {case.path} body={str(case.body)[:300]}"
    assert resp.status_code < 500, f"{resp.status_code} for {where}: {resp.text[:300]}"
    if resp.status_code >= 400:
        check_error_body(resp)
        return
    if header(resp, "content-type").startswith("text/event-stream"):
        events = [line[5:] for line in resp.text.splitlines()
                  if line.startswith("data:") and line != "data: [DONE]"]
        for ev in events:
            assert "error" not in json.loads(ev), f"error event for {where}: {ev[:300]}"
        assert resp.text.rstrip().endswith("data: [DONE]"), where


def test_fuzz_openapi_no_5xx_and_openai_errors(serve_urls):
    import hypothesis.strategies as st
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode
    from serve_helpers import wait_clean

    url = serve_urls["async_chunk"]
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", timeout=30)
    session = requests.Session()
    counts: dict[str, int] = {}
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"
        positive = op.as_strategy(GenerationMode.POSITIVE)
        strategy = st.one_of(
            st.tuples(positive, st.sampled_from([0, 1, 2, 2]), st.text(min_size=1, max_size=300))
            .map(lambda c: steer(*c)),
            op.as_strategy(GenerationMode.NEGATIVE))

        @settings(max_examples=EXAMPLES.get(label, DEFAULT_EXAMPLES), deadline=None,
                  database=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case):
            resp = case.call(base_url=url, session=session, timeout=60)
            counts[f"{label} {resp.status_code}"] = counts.get(f"{label} {resp.status_code}", 0) + 1
            check_response(case, resp)

        run()
    print(f"\nfuzz: {sum(counts.values())} requests in {time.monotonic() - t0:.0f}s: "
          f"{dict(sorted(counts.items()))}")
    assert any(k.startswith("POST /v1/chat/completions 200") for k in counts), counts
    assert wait_clean(url, 10) == {}


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/nope", 404), ("DELETE", "/v1/chat/completions", 405), ("PUT", "/v1/models", 405)])
def test_routing_errors_use_openai_schema(serve_urls, method, path, status):
    import httpx

    resp = httpx.request(method, f"{serve_urls['async_chunk']}{path}", timeout=30)
    assert resp.status_code == status
    check_error_body(resp)


@pytest.mark.parametrize("patch,status,param", [
    ({"temperature": 5e-324}, 200, None),        # logits / temperature overflowed to inf: 500
    ({"temperature": 1.0, "seed": 2 ** 70}, 400, "seed"),  # torch's seed overflow: 500
    ({"temperature": 1.0, "seed": -(2 ** 63)}, 200, None),
])
def test_found_by_fuzzing(serve_urls, patch, status, param):
    import httpx

    body = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, **patch}
    resp = httpx.post(f"{serve_urls['async_chunk']}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == status, resp.text
    if status != 200:
        check_error_body(resp)
        assert resp.json()["error"]["param"] == param
    else:
        assert resp.json()["choices"][0]["message"]["content"]
