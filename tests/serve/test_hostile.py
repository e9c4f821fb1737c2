"""Hostile and careless input over real HTTP (issue 18): every refusal a 4xx in OpenAI's error
shape naming the field, never a 5xx; strict types; every OpenAI chat field honoured, accepted as
harmless or refused as unsupported; costs bounded before work. Uses the session's apps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from serve_helpers import SSEClient, body, stats, wait_clean

pytestmark = pytest.mark.slow

BASE = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
ERROR_KEYS = {"message", "type", "param", "code"}
USER = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# (body patch, status, param, code or None) -- the body is BASE updated with the patch.
BAD = [
    # strict types: nothing coerced
    ({"max_tokens": "4"}, 400, "max_tokens", None),
    ({"max_tokens": True}, 400, "max_tokens", None),
    ({"max_tokens": 4.0}, 400, "max_tokens", None),
    ({"max_tokens": -1}, 400, "max_tokens", None),
    ({"max_completion_tokens": "8"}, 400, "max_completion_tokens", None),
    ({"max_audio_frames": False}, 400, "max_audio_frames", None),
    ({"stream": "yes"}, 400, "stream", None),
    ({"stream": 1}, 400, "stream", None),
    ({"temperature": "0.5"}, 400, "temperature", None),
    ({"temperature": 3}, 400, "temperature", None),
    ({"temperature": True}, 400, "temperature", None),
    ({"top_p": 0}, 400, "top_p", None),
    ({"top_p": "1"}, 400, "top_p", None),
    ({"seed": "1"}, 400, "seed", None),
    ({"seed": 2 ** 64}, 400, "seed", None),
    ({"seed": 1.5}, 400, "seed", None),
    ({"model": 7}, 400, "model", None),
    ({"model": None}, 400, "model", None),
    ({"messages": "Hi"}, 400, "messages", None),
    ({"messages": {"role": "user"}}, 400, "messages", None),
    ({"messages": [None]}, 400, "messages.0", None),
    ({"messages": [{"content": "Hi"}]}, 400, "messages.0.role", None),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content", None),
    ({"messages": [{"role": "user", "content": ["Hi"]}]}, 400, "messages.0.content.0", None),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
     "messages.0.content.0.text", None),
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": {}}]}]}, 400,
     "messages.0.content.0", None),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
     400, "messages.0.content.0.x", "unknown_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:,x"}, "x": 1}]}]}, 400, "messages.0.content.0.x", "unknown_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": 3}]}]}, 400, "messages.0.content.0",
     "invalid_content_part"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]}, 400,
     "messages.0", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:,x", "detail": "ultra"}}]}]}, 400, "messages.0.content.0.image_url.detail",
     None),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": "AAAA", "format": "ogg"}}]}]}, 400, "messages.0.content.0.input_audio.format",
     None),
    ({"modalities": "text"}, 400, "modalities", None),
    ({"modalities": ["text", "text"]}, 400, "modalities", None),
    ({"audio": "ethan"}, 400, "audio", None),
    ({"audio": {"format": "wav"}}, 400, "audio.voice", None),
    ({"stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage", None),
    ({"stream_options": {"x": 1}}, 400, "stream_options.x", "unknown_parameter"),
    # unknown fields are refused, as by OpenAI's API
    ({"frobnicate": 1}, 400, "frobnicate", "unknown_parameter"),
    ({"max_token": 5}, 400, "max_token", "unknown_parameter"),
    # fields this server does not honour: refused, saying so
    ({"tools": [TOOL]}, 400, "tools", "unsupported_parameter"),
    ({"tool_choice": "auto"}, 400, "tool_choice", "unsupported_parameter"),
    ({"tool_choice": "required"}, 400, "tool_choice", "unsupported_parameter"),
    ({"parallel_tool_calls": False}, 400, "parallel_tool_calls", "unsupported_parameter"),
    ({"functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
    ({"function_call": "auto"}, 400, "function_call", "unsupported_parameter"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format",
     "unsupported_parameter"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
     "response_format", "unsupported_parameter"),
    ({"logprobs": True}, 400, "logprobs", "unsupported_parameter"),
    ({"top_logprobs": 3}, 400, "top_logprobs", "unsupported_parameter"),
    ({"stop": "\n"}, 400, "stop", "unsupported_parameter"),
    ({"stop": ["a", "b"]}, 400, "stop", "unsupported_parameter"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty", "unsupported_parameter"),
    ({"frequency_penalty": -1}, 400, "frequency_penalty", "unsupported_parameter"),
    ({"logit_bias": {"50256": -100}}, 400, "logit_bias", "unsupported_parameter"),
    ({"n": 2}, 400, "n", "unsupported_parameter"),
    ({"n": 0}, 400, "n", "unsupported_parameter"),
    ({"prediction": {"type": "content", "content": "x"}}, 400, "prediction",
     "unsupported_parameter"),
    ({"web_search_options": {}}, 400, "web_search_options", "unsupported_parameter"),
    ({"reasoning_effort": "high"}, 400, "reasoning_effort", "unsupported_parameter"),
    ({"verbosity": "low"}, 400, "verbosity", "unsupported_parameter"),
    ({"store": True}, 400, "store", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]},
     400, "messages.1.tool_calls", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "audio": {"id": "audio_1"}}]},
     400, "messages.1.audio.id", "invalid_audio_id"),  # an id this server never gave
    ({"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "audio": {"id": "audio_1", "data": "AAAA"}}]},
     400, "messages.1.audio.data", "unknown_parameter"),
    # limits and cost
    ({"messages": USER * 65}, 400, "messages", None),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 257}]}, 400,
     "messages", "too_many_content_parts"),
    ({"messages": [{"role": "user", "content": "a" * (512 * 32 + 1)}]}, 400, "messages",
     "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "a" * 9000},
                   {"role": "user", "content": [{"type": "text", "text": "b" * 9000}]}]},
     400, "messages", "context_length_exceeded"),
    ({"max_tokens": 10 ** 9}, 400, "max_tokens", None),
    ({"messages": [{"role": "assistant", "content": "Hi"}]}, 400, "messages", None),
    ({"messages": [{"role": "system", "content": "be brief"}]}, 400, "messages", None),
    ({"messages": [{"role": "user", "content": []}]}, 400, "messages.0.content", None),
    ({"messages": [{"role": "user", "content": None}]}, 400, "messages.0.content", None),
    ({"messages": [{"role": "user", "content": "\ud83d"}]}, 400, "messages.0.content", None),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": "!!not base64!!", "format": "wav"}}]}]}, 400,
     "messages.0.content.0.input_audio", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "file:///etc/passwd"}}]}]}, 400, "messages.0.content.0.image_url.url", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "http://169.254.169.254/latest/meta-data/"}}]}]}, 400,
     "messages.0.content.0.image_url.url", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,iVBORw0KGgo="}}]}]}, 400,
     "messages.0.content.0.image_url", None),
    ({"model": "x" * 100_000}, 404, "model", "model_not_found"),
]

# Values that ask for nothing: accepted (a 200), as are harmless fields.
NO_OPS = [{"n": 1}, {"n": None}, {"presence_penalty": 0}, {"frequency_penalty": 0.0},
          {"tools": []}, {"tool_choice": "none"}, {"stop": []}, {"stop": None},
          {"logprobs": False}, {"top_logprobs": 0}, {"logit_bias": {}},
          {"response_format": {"type": "text"}}, {"store": False}, {"user": "u-1"},
          {"metadata": {"k": "v"}}, {"service_tier": "auto"}, {"safety_identifier": "s"},
          {"prompt_cache_key": "p"}, {"stream": None}, {"temperature": 0},
          {"messages": [{"role": "user", "content": "Hi", "name": "alice"}]},
          {"messages": [{"role": "developer", "content": "be brief"}, *USER]}]


def post(url: str, payload, **kw) -> httpx.Response:
    """``payload`` as escaped JSON (lone surrogates survive), or raw bytes."""
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return httpx.post(f"{url}/v1/chat/completions", content=content,
                      headers={"content-type": "application/json"}, timeout=60, **kw)


def openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["message"] and err["type"], err
    return err


@pytest.mark.parametrize("patch,status,param,code", BAD,
                         ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_is_4xx_naming_the_field(serve_urls, patch, status, param, code):
    err = openai_error(post(serve_urls["async_chunk"], {**BASE, **patch}), status)
    assert err["param"] == param or err["param"].startswith(param + "."), err
    assert err["message"].startswith(param) or param in err["message"], err
    if code:
        assert err["code"] == code, err
    if code == "unsupported_parameter":
        assert "not supported" in err["message"], err
    assert len(err["message"]) < 500, err  # nothing of the input echoed whole


@pytest.mark.parametrize("patch", NO_OPS, ids=[next(iter(p)) + str(i) for i, p in
                                               enumerate(NO_OPS)])
def test_no_op_values_and_harmless_fields_are_accepted(serve_urls, patch):
    r = post(serve_urls["async_chunk"], {**BASE, **patch})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("raw,says", [
    (b"{not json", "not valid JSON"),
    (b'{"model": "qwen3-omni",', "not valid JSON"),
    (b"", "request body is required"),
    (b"[]", "must be a JSON object"),
    (b'"hi"', "must be a JSON object"),
    (b"null", "request body is required"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_body_errors_name_no_field(serve_urls, raw, says):
    err = openai_error(post(serve_urls["async_chunk"], raw), 400)
    assert err["param"] is None and says in err["message"], err
    if says == "not valid JSON":
        assert "position" in err["message"], err


def test_openai_client_gets_bad_request_for_unsupported_fields(serve_urls):
    client = openai.OpenAI(base_url=f"{serve_urls['async_chunk']}/v1", api_key="none",
                           max_retries=0)
    for kw, param in (({"tools": [TOOL]}, "tools"), ({"stop": ["x"]}, "stop"),
                      ({"response_format": {"type": "json_object"}}, "response_format"),
                      ({"max_tokens": "4"}, "max_tokens")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="qwen3-omni", messages=USER, **kw)
        assert e.value.param == param, e.value.body


def test_huge_prompt_is_refused_before_tokenizing(serve_urls):
    """30 MB of text (65 s of tokenizing before the limit) is a 400 from its length alone."""
    url = serve_urls["async_chunk"]
    payload = json.dumps({**BASE, "messages": [{"role": "user", "content": "ab " * 10_000_000}]})
    t0 = time.monotonic()
    err = openai_error(post(url, payload.encode()), 400)
    elapsed = time.monotonic() - t0
    assert err["param"] == "messages" and "limits.max_prompt_chars" in err["message"], err
    assert elapsed < 10, f"{elapsed:.1f} s: the prompt was not refused before tokenizing"


def test_long_model_name_is_clipped_in_the_404(serve_urls):
    name = "m" * 1_000_000
    err = openai_error(post(serve_urls["async_chunk"], {**BASE, "model": name}), 404)
    assert err["param"] == "model" and len(err["message"]) < 300, err["message"][:400]


def test_aborts_are_counted_once_per_disconnect(serve_urls):
    """Every stage counts one abort per disconnected request (it counted up to two)."""
    url, n = serve_urls["async_chunk"], 6
    assert wait_clean(url, 10) == {}
    before = {k: v["aborts"] for k, v in stats(url).items()}
    for _ in range(n):
        c = SSEClient(url, body("Tell me a long story", max_tokens=200, frames=1000),
                      abort_after=3)
        c.run()
        assert c.aborted, (c.status, c.error_body, c.exception)
        assert wait_clean(url, 10) == {}
    time.sleep(0.5)  # a late second abort would land now
    delta = {k: v["aborts"] - before[k] for k, v in stats(url).items()}
    assert all(0 <= d <= n for d in delta.values()), delta
    assert delta["thinker"] == n, delta  # 200 tokens: every request was still in the thinker


def test_disconnects_log_no_traceback(serve_urls):
    import ray

    url = serve_urls["sync"]
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    ingress = sorted(logs.glob("replica_omni-sync_OmniIngress_*.log"))
    assert ingress, sorted(p.name for p in logs.iterdir())
    sizes = {p: p.stat().st_size for p in ingress}
    for _ in range(4):
        c = SSEClient(url, body("Tell me a long story", max_tokens=200, frames=1000),
                      abort_after=2)
        c.run()
        assert c.aborted
    assert wait_clean(url, 10) == {}
    time.sleep(1.0)  # log lines are flushed by the replica's handler
    new = "".join(p.read_bytes()[sizes[p]:].decode(errors="replace") for p in ingress)
    assert "POST" in new, new[-2000:]  # the requests were logged here
    assert "Traceback" not in new and "TaskCancelledError" not in new, new[-4000:]
