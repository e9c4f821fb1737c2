"""``WS /v1/realtime``: one socket's wiring to the ingress.

The socket is accepted, then checked as an HTTP request is: the API key (``Authorization:
Bearer`` or OpenAI's browser subprotocol ``openai-insecure-api-key.<key>``), the ``model`` query
parameter, and a per-key slot (``limits.max_concurrent_requests_per_key`` counts open sockets
with the requests). A refusal is an ``error`` event and a close (1008, or 1013 when over the
key's concurrency). Then client events go to a ``RealtimeSession``; its answers are built exactly
as a chat completion's (``RequestBuilder.chat``, ``OmniIngress._open``, ``Answers.events``: the
same limits, media decoding and stage lifecycle). The socket closing, or idling past
``realtime.idle_timeout_s`` with no response running, frees everything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_ray.ingress.errors import APIError
from omni_ray.ingress.realtime import protocol as P
from omni_ray.ingress.realtime.session import RealtimeSession

logger = logging.getLogger("ray.serve")

KEY_SUBPROTOCOL = "openai-insecure-api-key."  # OpenAI's browser clients put the key here
POLICY_VIOLATION, TRY_AGAIN_LATER = 1008, 1013


class IngressBackend:
    """The session's ``Backend``: answers through the ingress as the chat API does."""

    def __init__(self, ingress):
        self.ingress = ingress
        self.model_id = ingress.args.model_id
        self.default_voice = ingress.args.default_speaker

    def check_voice(self, voice: str) -> None:
        from omni_ray.models.speakers import resolve_speaker

        resolve_speaker(voice, self.ingress.speakers)

    async def respond(self, messages: list[dict], voice: str, modalities: list[str],
                      max_tokens: int | None) -> AsyncIterator[dict]:
        from omni_ray.ingress.api_models import ChatCompletionRequest
        from omni_ray.metrics import RequestStatus

        ing = self.ingress
        body = {"model": self.model_id, "messages": messages, "modalities": modalities,
                "stream": True}
        if "audio" in modalities:
            body["audio"] = {"voice": voice, "format": "pcm16"}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        track = ing.metrics.track(modalities)
        try:
            req, _ = await ing.requests.chat(ChatCompletionRequest.model_validate(body))
        except ValidationError as e:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise P.from_validation(e) from None
        except APIError as e:
            track.finish(RequestStatus.INVALID, "invalid_request")
            raise _protocol_error(e) from None
        ing.timeline.start(req.request_id, "received")
        try:
            stream = await ing._open(req, None, track)
        except APIError as e:
            raise _protocol_error(e) from None
        async for ev in ing.answers.events(req, stream, track):
            yield ev


class RealtimeEndpoint:
    """The replica's sockets: serves each, and counts them for ``/debug/realtime``."""

    def __init__(self, ingress):
        self.ingress = ingress
        self.sessions: set[RealtimeSession] = set()

    def stats(self) -> dict:
        return {"sockets": len(self.sessions),
                "responses": sum(1 for s in self.sessions if s.response is not None),
                "items": sum(len(s.items) for s in self.sessions)}

    async def serve(self, ws: WebSocket) -> None:
        ing = self.ingress
        offered = ws.scope.get("subprotocols") or []
        token = next((p[len(KEY_SUBPROTOCOL):] for p in offered
                      if p.startswith(KEY_SUBPROTOCOL)), None)
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        lock = asyncio.Lock()

        async def send(event: dict) -> None:
            async with lock:
                if ws.application_state is WebSocketState.CONNECTED:
                    await ws.send_text(json.dumps(event))

        events = P.ServerEvents()
        # 1) API key, 2) model, 3) the key's slot.
        guard = ing.guard
        key = None
        if guard.auth_enabled:
            headers = Headers(scope=ws.scope)
            if token is not None:
                headers = Headers({"authorization": f"Bearer {token}"})
            key = guard.authenticate(headers)
            if key is None:
                return await self._refuse(ws, send, events, P.ProtocolError(
                    "missing or invalid API key (Authorization: Bearer <key>, or the "
                    f"{KEY_SUBPROTOCOL}<key> subprotocol)", None, "invalid_api_key",
                    type="authentication_error"), POLICY_VIOLATION)
        model = ws.query_params.get("model")
        if model is not None and model != ing.args.model_id:
            return await self._refuse(ws, send, events, P.ProtocolError(
                f"model {model[:64]!r} not found; this server serves {ing.args.model_id!r}",
                "model", "model_not_found"), POLICY_VIOLATION)
        limited = key is not None and guard.max_concurrent_per_key > 0
        if limited and not guard.can_acquire(key):
            return await self._refuse(ws, send, events, P.ProtocolError(
                "too many concurrent requests for this API key (limits."
                f"max_concurrent_requests_per_key={guard.max_concurrent_per_key}; an open "
                "realtime socket counts as one)", None, "too_many_concurrent_requests",
                type="rate_limit_error"), TRY_AGAIN_LATER)
        if limited:
            guard.acquire(key)
        beta = "realtime=v1" in ws.headers.get("openai-beta", "")
        session = RealtimeSession(IngressBackend(ing), send, ing.args.realtime, beta=beta)
        self.sessions.add(session)
        try:
            await session.start()
            await self._loop(ws, session)
        finally:
            await session.close()
            self.sessions.discard(session)
            if limited:
                guard.release(key)

    async def _loop(self, ws: WebSocket, session: RealtimeSession) -> None:
        """Client events to the session until the socket closes or idles out."""
        idle_s = self.ingress.args.realtime.idle_timeout_s
        last = time.monotonic()
        receive = None
        try:
            while True:
                if receive is None:
                    receive = asyncio.ensure_future(ws.receive())
                wait = max(0.05, min(idle_s - (time.monotonic() - last), 1.0))
                done, _ = await asyncio.wait({receive}, timeout=wait)
                if not done:
                    if session.response is not None:
                        last = time.monotonic()  # an answer streaming is activity
                    elif time.monotonic() - last >= idle_s:
                        await session.send(session.ev.error(P.ProtocolError(
                            f"the session was idle for realtime.idle_timeout_s={idle_s}; "
                            "closing it", None, "session_idle_timeout")))
                        await ws.close(1000)
                        return
                    continue
                msg, receive = receive.result(), None
                if msg["type"] == "websocket.disconnect":
                    return
                last = time.monotonic()
                data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                await session.handle(data or "")
        except (WebSocketDisconnect, RuntimeError):
            return  # the client left mid-send
        finally:
            if receive is not None:
                receive.cancel()

    @staticmethod
    async def _refuse(ws: WebSocket, send, events: P.ServerEvents, e: P.ProtocolError,
                      code: int) -> None:
        try:
            await send(events.error(e))
            await ws.close(code, reason=e.code or "")
        except Exception:  # noqa: BLE001 - already gone
            pass


def _protocol_error(e: APIError) -> P.ProtocolError:
    return P.ProtocolError(e.message, e.param, e.code, type=e.type)
