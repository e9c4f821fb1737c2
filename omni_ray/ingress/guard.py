"""The ingress's request guard: API keys, the request body limit and per-key concurrency.

A pure ASGI middleware rather than ``@app.middleware("http")`` so that it can (1) cap bodies sent
without ``content-length`` (chunked) by reading at most ``limits.max_body_bytes`` before the app
sees them, and (2) hold a per-key slot until the response, streaming included, has ended.

The ``Guard`` itself lives on the served app's ``state`` (``OmniIngress`` puts it there). A request
reaching a guarded path of an app without one is refused (503): fail closed, never open.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping

from ray.exceptions import TaskCancelledError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omni_ray.config.serving import SecurityConfig
from omni_ray.ingress.errors import APIError

logger = logging.getLogger("ray.serve")

# Paths anyone may call: the health probe and the playground's static page and files.
OPEN_PATHS = frozenset({"/health", "/", "/playground"})
OPEN_PREFIXES = ("/static/",)
RETRY_AFTER_S = 1


def resolve_api_keys(security: SecurityConfig, environ: Mapping[str, str]) -> list[str]:
    """The accepted keys: ``security.api_keys`` (SecretStr), the comma-separated
    ``api_keys_env`` var and the lines of ``api_keys_file``."""
    keys = [k.get_secret_value() for k in security.api_keys]
    if security.api_keys_env and environ.get(security.api_keys_env):
        keys += [k.strip() for k in environ[security.api_keys_env].split(",")]
    if security.api_keys_file:
        keys += read_keys_file(security.api_keys_file)
    return [k for k in keys if k]


def read_keys_file(path: str) -> list[str]:
    """One key per line; blank lines and ``#`` comments skipped. Errors name the path, never a
    line's content."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"security.api_keys_file: cannot read {path!r} "
                         f"({type(e).__name__})") from None
    keys = [line for line in lines if line and not line.startswith("#")]
    if not keys:
        raise ValueError(f"security.api_keys_file: {path!r} holds no key")
    return keys


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


class Guard:
    """Key checks and in-flight counts of one ingress replica (one event loop, no locks)."""

    def __init__(self, keys: list[str], max_body_bytes: int, max_concurrent_per_key: int = 0):
        # SHA-256 digests: equal lengths, so compare_digest leaks nothing about key lengths.
        self._digests = [_digest(k.encode()) for k in keys if k]
        self.max_body_bytes = max_body_bytes
        self.max_concurrent_per_key = max_concurrent_per_key
        self.in_flight: dict[bytes, int] = {}  # key digest -> requests whose response is open

    @property
    def auth_enabled(self) -> bool:
        return bool(self._digests)

    def authenticate(self, headers: Headers) -> bytes | None:
        """The digest of the request's Bearer key if it is one of ours, else None."""
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        got = _digest(token.strip().encode() if scheme.lower() == "bearer" else b"")
        ok = False
        for d in self._digests:  # every key compared, in constant time
            ok |= hmac.compare_digest(got, d)
        return got if ok else None

    def can_acquire(self, key: bytes) -> bool:
        limit = self.max_concurrent_per_key
        return not limit or self.in_flight.get(key, 0) < limit

    def acquire(self, key: bytes) -> None:
        self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def release(self, key: bytes) -> None:
        left = self.in_flight.get(key, 0) - 1
        if left > 0:
            self.in_flight[key] = left
        else:
            self.in_flight.pop(key, None)


class GuardMiddleware:
    """Runs ``app.state.guard`` on every HTTP request: 401, 413, 429 (or 503 with no guard)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = _route_path(scope)
        if is_open_path(path):
            return await self.app(scope, receive, send)
        guard: Guard | None = getattr(scope["app"].state, "guard", None) if "app" in scope else None
        if guard is None:
            return await _reply(APIError(503, "the ingress is not initialized",
                                         type="server_error"), scope, receive, send)
        headers = Headers(scope=scope)
        # 1) API key.
        key = None
        if guard.auth_enabled:
            key = guard.authenticate(headers)
            if key is None:
                return await _reply(APIError(
                    401, "missing or invalid API key (Authorization: Bearer <key>)",
                    type="authentication_error", code="invalid_api_key",
                    headers={"www-authenticate": "Bearer"}), scope, receive, send)
        # 2) Body size: the declared length, then the bytes that actually arrive.
        too_big = APIError(413, f"request body over limits.max_body_bytes={guard.max_body_bytes}",
                           param="body", code="body_too_large")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > guard.max_body_bytes:
            return await _reply(too_big, scope, receive, send)
        first = await _read_body(receive, guard.max_body_bytes)
        if first is None:
            return await _reply(too_big, scope, receive, send)
        receive = _replay(first, receive)
        # 3) In-flight generation requests per key, released when the response has ended.
        if key is None or scope["method"] != "POST" or not guard.max_concurrent_per_key:
            return await self.app(scope, receive, send)
        if not guard.can_acquire(key):
            return await _reply(APIError(
                429, f"too many concurrent requests for this API key (limits."
                     f"max_concurrent_requests_per_key={guard.max_concurrent_per_key})",
                type="rate_limit_error", code="too_many_concurrent_requests",
                headers={"retry-after": str(RETRY_AFTER_S)}), scope, receive, send)
        guard.acquire(key)
        try:
            await self.app(scope, receive, send)
        finally:
            guard.release(key)


def _digest(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def _route_path(scope: Scope) -> str:
    """The path inside the app: Serve's route prefix (``root_path``) removed."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):] or "/"
    return path


async def _read_body(receive: Receive, limit: int) -> Message | None:
    """The whole body as one message, or None once more than ``limit`` bytes arrived."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return msg  # the client left: the app sees the disconnect
        body = msg.get("body", b"")
        size += len(body)
        if size > limit:
            return None
        chunks.append(body)
        if not msg.get("more_body", False):
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


def _replay(first: Message, receive: Receive) -> Receive:
    """A receive that hands out ``first``, then whatever the client sends next (disconnect)."""
    pending: list[Message] = [first]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        try:
            return await receive()
        except TaskCancelledError:
            # Serve's proxy cancels the replica's pending receive when the client leaves: an
            # ordinary disconnect (one INFO line), not a failed request with a traceback.
            logger.info("client disconnected")
            return {"type": "http.disconnect"}

    return replayed


async def _reply(err: APIError, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(err.body(), status_code=err.status, headers=err.headers)
    await response(scope, receive, send)
