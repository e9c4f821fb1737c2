"""omni_ray/ingress/guard.py without Ray: the middleware driven by raw ASGI calls."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from pydantic import SecretStr

from omni_ray.config.serving import SecurityConfig
from omni_ray.ingress.guard import Guard, GuardMiddleware, resolve_api_keys

KEY, OTHER = "k-123", "k-456"


class App:
    """The app behind the guard: echoes the body length; POSTs may wait on ``gate``."""

    def __init__(self, guard: Guard | None):
        self.state = SimpleNamespace(**({"guard": guard} if guard else {}))
        self.gate: asyncio.Event | None = None
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.bodies.append(body)
        if self.gate is not None and scope["method"] == "POST":
            await self.gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


async def call(app, path="/v1/chat/completions", *, method="POST", key=None, chunks=(b"{}",),
               length=True, root_path=""):
    """One request through GuardMiddleware(app): (status, headers, body)."""
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    if length:
        headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
    scope = {"type": "http", "method": method, "path": root_path + path, "root_path": root_path,
             "headers": headers, "app": app}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
               for i, c in enumerate(chunks)]

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)

    out = {}

    async def send(msg):
        if msg["type"] == "http.response.start":
            out["status"], out["headers"] = msg["status"], dict(msg["headers"])
        else:
            out["body"] = out.get("body", b"") + msg.get("body", b"")

    await GuardMiddleware(app)(scope, receive, send)
    return out["status"], out["headers"], out["body"]


def run(coro):
    return asyncio.run(coro)


def error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_no_guard_fails_closed_but_health_stays_open():
    app = App(None)
    assert run(call(app))[0] == 503
    assert run(call(app, "/health", method="GET"))[0] == 200


@pytest.mark.parametrize("key", [None, "wrong", KEY + "x", KEY[:-1], ""])
def test_missing_or_wrong_key_is_401_in_openai_schema(key):
    status, headers, body = run(call(App(Guard([KEY, OTHER], 4096)), key=key))
    assert status == 401 and headers[b"www-authenticate"] == b"Bearer"
    err = error(body)
    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/v1/models", "/debug/stats", "/metrics", "/docs", "/v1/x"])
def test_every_non_open_path_needs_the_key(path):
    app = App(Guard([KEY], 4096))
    assert run(call(app, path, method="GET"))[0] == 401
    assert run(call(app, path, method="GET", key=OTHER))[0] == 401
    assert run(call(app, path, method="GET", key=KEY))[0] == 200


@pytest.mark.parametrize("path", ["/health", "/", "/playground", "/static/playground.js"])
def test_open_paths_need_no_key_also_under_a_route_prefix(path):
    app = App(Guard([KEY], 4096))
    assert run(call(app, path, method="GET"))[0] == 200
    assert run(call(app, path, method="GET", root_path="/omni"))[0] == 200
    assert run(call(app, "/v1/models", method="GET", root_path="/omni"))[0] == 401


def test_either_key_works_and_no_keys_means_no_auth():
    app = App(Guard([KEY, OTHER], 4096))
    assert run(call(app, key=KEY))[0] == 200 and run(call(app, key=OTHER))[0] == 200
    assert run(call(App(Guard([], 4096))))[0] == 200


def test_body_limit_declared_and_chunked():
    app = App(Guard([], 1024))
    status, _, body = run(call(app, chunks=(bytes(1025),)))
    assert status == 413 and "limits.max_body_bytes=1024" in error(body)["message"]
    assert app.bodies == []
    # Chunked (no content-length): counted as it arrives, refused once over the limit.
    status, _, body = run(call(app, chunks=(bytes(600), bytes(600)), length=False))
    assert status == 413 and error(body)["param"] == "body"
    assert app.bodies == []
    # Under the limit, the app gets the whole body.
    assert run(call(app, chunks=(bytes(500), bytes(500)), length=False))[2] == b"1000"
    assert app.bodies == [bytes(1000)]


def test_auth_is_checked_before_the_body():
    status, _, _ = run(call(App(Guard([KEY], 1024)), chunks=(bytes(5000),)))
    assert status == 401


def test_concurrency_per_key_is_429_and_released_when_the_response_ends():
    async def scenario():
        guard = Guard([KEY, OTHER], 4096, max_concurrent_per_key=1)
        app = App(guard)
        app.gate = asyncio.Event()
        first = asyncio.create_task(call(app, key=KEY))
        await asyncio.sleep(0.05)
        status, headers, body = await call(app, key=KEY)
        assert status == 429 and headers[b"retry-after"] == b"1"
        err = error(body)
        assert "limits.max_concurrent_requests_per_key=1" in err["message"]
        assert err["type"] == "rate_limit_error"
        other = asyncio.create_task(call(app, key=OTHER))  # another key has its own budget
        await asyncio.sleep(0.05)
        assert not other.done()
        assert (await call(app, "/v1/models", method="GET", key=KEY))[0] == 200  # GETs: not counted
        app.gate.set()
        assert (await first)[0] == 200 and (await other)[0] == 200
        assert guard.in_flight == {}
        app.gate = None
        assert (await call(app, key=KEY))[0] == 200

    run(scenario())


def test_slot_is_released_when_the_app_fails():
    class Failing(App):
        async def __call__(self, scope, receive, send):
            raise RuntimeError("boom")

    guard = Guard([KEY], 4096, max_concurrent_per_key=1)
    with pytest.raises(RuntimeError):
        run(call(Failing(guard), key=KEY))
    assert guard.in_flight == {}


def test_keys_from_config_and_env():
    sec = SecurityConfig(api_keys=[SecretStr("a")], api_keys_env="MY_KEYS")
    assert resolve_api_keys(sec, {"MY_KEYS": " b, c ,,"}) == ["a", "b", "c"]
    assert resolve_api_keys(sec, {}) == ["a"]
    assert resolve_api_keys(SecurityConfig(api_keys_env=None), {"OMNI_RAY_API_KEYS": "x"}) == []


def test_keys_never_print():
    from omni_ray.config.serving import OmniServingArgs

    args = OmniServingArgs.model_validate({"security": {"api_keys": [SecretStr("sekrit-key-1")]}})
    for text in (repr(args), str(args), repr(args.model_dump()), args.model_dump_json(),
                 repr(args.security)):
        assert "sekrit-key-1" not in text
    with pytest.raises(ValueError) as e:  # nor in validation errors
        OmniServingArgs.model_validate({"security": {"api_keys": [SecretStr("sekrit-key-1"),
                                                                  SecretStr("")]}})
    assert "sekrit-key-1" not in str(e.value)
    with pytest.raises(ValueError):  # a masked dump fed back in is not a key
        OmniServingArgs.model_validate(args.model_dump(mode="json"))
    # Python dumps keep the SecretStr, so the ingress re-validates what the builder bound.
    again = OmniServingArgs.model_validate(args.model_dump())
    assert again.security.api_keys[0].get_secret_value() == "sekrit-key-1"


def test_plain_keys_in_args_are_refused_naming_the_field():
    """A config file's args are printed by Serve before the builder runs: plain keys refused."""
    from omni_ray.config.serving import OmniServingArgs

    for keys in (["sekrit-key-1"], [SecretStr("a"), "sekrit-key-1"]):
        with pytest.raises(ValueError) as e:
            OmniServingArgs.model_validate({"security": {"api_keys": keys}})
        msg = str(e.value)
        assert "security.api_keys" in msg and "api_keys_env" in msg and "api_keys_file" in msg
        assert "sekrit-key-1" not in msg


def test_keys_from_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# ops keys\n  k-one  \n\nk-two\n")
    sec = SecurityConfig(api_keys_env=None, api_keys_file=str(f))
    assert resolve_api_keys(sec, {}) == ["k-one", "k-two"]
    f.write_text("# only a comment\n\n")
    with pytest.raises(ValueError, match="api_keys_file.*no key"):  # fail closed, never open
        resolve_api_keys(sec, {})
    with pytest.raises(ValueError, match="api_keys_file.*cannot read"):
        resolve_api_keys(SecurityConfig(api_keys_file=str(tmp_path / "missing")), {})
