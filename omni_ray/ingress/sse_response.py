"""The event-stream response: it ends when its generator ends, never on a spurious disconnect.

Starlette's ``StreamingResponse`` (for ASGI spec < 2.4, which uvicorn and so Serve announce) runs
the body next to a task that reads ``receive()`` and cancels the body at the first
``http.disconnect``. Inside a Serve replica ``receive()`` is a proxy of the proxy actor's queue,
and it also answers ``http.disconnect`` while the client is still reading: when the proxy no
longer knows the request (``KeyError`` in ``ASGIReceiveProxy.fetch_until_disconnect``) or the
fetch fails. The body was then cut where it stood, with neither an error event nor ``[DONE]``,
behind a 200 (issue 18, item 8).

A client that really leaves is seen by Serve's proxy, which cancels the replica's call: the
generator gets ``CancelledError`` and aborts the request in every stage (``PipelineStream``). So
this response ignores what ``receive()`` says and ends only when its generator does.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.responses import StreamingResponse
from starlette.types import Receive, Send

logger = logging.getLogger("ray.serve")


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"
    disconnect_seen = False  # receive() said http.disconnect while the body was streaming

    async def listen_for_disconnect(self, receive: Receive) -> None:
        """Drain ``receive()`` and wait for ever: the task group ends with the body."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnect_seen = True
                await asyncio.Event().wait()

    async def stream_response(self, send: Send) -> None:
        await super().stream_response(send)
        if self.disconnect_seen:  # not cancelled by Serve: the client was there all along
            logger.info("event stream finished after a spurious http.disconnect from receive() "
                        "(Starlette would have cut it)")
