"""Object-ref push between stage engine actors.

The producer calls the consumer's ``push`` with the chunk encoded by the wire codec (a numpy
buffer: inlined in the call when small, a zero-copy object-store read when large). Per request:

* ``ChunkSender`` keeps chunks in order and at most ``max_in_flight`` pushes unacknowledged; it
  awaits every push it made, so no object ref outlives the request, and reports a failed push
  (e.g. the receiving engine died) to its owner instead of hanging;
* ``Reorderer`` on the receiving side releases chunks strictly by ``seq`` and rejects duplicates
  (nothing dropped silently, nothing applied twice).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from omni_ray.payload import encode_chunk


class ChunkSender:
    """Ordered, bounded push of one request's chunks to a downstream actor.

    ``on_ack(seconds, nbytes)`` is called for every acknowledged push with its round trip (push
    to the receiver's acceptance). A failed push (the receiver died or raised) stops the sender
    and calls ``on_error(exc)`` once, so the owner can end the request instead of hanging.
    """

    def __init__(self, downstream, max_in_flight: int = 8, *,
                 on_ack: Callable[[float, int], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 attach_timeout_s: float = 5.0):
        """``downstream``: the receiver, or a future of it (the chunks wait for it, at most
        ``attach_timeout_s`` from the first; then the sender fails like a failed push)."""
        self.downstream = downstream
        self.attach_timeout_s = attach_timeout_s
        self.max_in_flight = max_in_flight
        self._on_ack, self._on_error = on_ack, on_error
        self._queue: asyncio.Queue = asyncio.Queue()
        self._in_flight: deque[asyncio.Future] = deque()
        self.bytes_sent = 0
        self.chunks_sent = 0
        self.rejected = False  # the receiver no longer knows the request
        self.error: BaseException | None = None  # the failed push, if any
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(self, chunk) -> None:
        if self.error is None:
            self._queue.put_nowait(chunk)

    def close(self) -> None:
        """No more chunks: the task ends once everything sent has been acknowledged."""
        self._queue.put_nowait(None)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def done(self) -> bool:
        return self._task.done()

    async def wait(self) -> None:
        """Until every push is acknowledged; raises the failed push's error, if any."""
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # we were cancelled, not the sender
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self._task.cancel()
        self._drop_in_flight()

    async def _run(self) -> None:
        try:
            while True:
                chunk = await self._queue.get()
                if chunk is None:
                    break
                if isinstance(self.downstream, asyncio.Future):  # the first chunk waits for it
                    self.downstream = await self._attached(self.downstream)
                if self.rejected:
                    continue
                buf = encode_chunk(chunk)
                self.bytes_sent += buf.nbytes
                self.chunks_sent += 1
                self._in_flight.append(self._push(buf))
                while len(self._in_flight) >= self.max_in_flight:
                    await self._ack()
            while self._in_flight:
                await self._ack()
        except Exception as e:  # noqa: BLE001 - any failed push ends this request, not the loop
            self.error = e
            self._drop_in_flight()
            if self._on_error is not None:
                self._on_error(e)

    async def _attached(self, fut: asyncio.Future):
        try:
            return await asyncio.wait_for(fut, self.attach_timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no next stage attached within {self.attach_timeout_s:g} s "
                               "of the first chunk") from None

    def _push(self, buf) -> asyncio.Future:
        """Push one chunk; the returned future resolves to the receiver's answer."""
        t0, nbytes = time.monotonic(), int(buf.nbytes)
        fut = asyncio.ensure_future(self.downstream.push.remote(buf))
        if self._on_ack is not None:
            def acked(f: asyncio.Future) -> None:
                if not f.cancelled() and f.exception() is None:
                    self._on_ack(time.monotonic() - t0, nbytes)
            fut.add_done_callback(acked)
        return fut

    async def _ack(self) -> None:
        accepted = await self._in_flight.popleft()
        if accepted is False:
            self.rejected = True

    def _drop_in_flight(self) -> None:
        for fut in self._in_flight:
            fut.cancel()
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: no "exception never retrieved" warning
        self._in_flight.clear()


class Reorderer:
    """Release one request's chunks in ``seq`` order."""

    def __init__(self):
        self.next_seq = 0
        self._held: dict[int, object] = {}

    def add(self, chunk) -> list:
        if chunk.seq < self.next_seq or chunk.seq in self._held:
            raise ValueError(f"{chunk.request_id}: duplicate chunk seq {chunk.seq}")
        self._held[chunk.seq] = chunk
        out = []
        while self.next_seq in self._held:
            out.append(self._held.pop(self.next_seq))
            self.next_seq += 1
        return out

    @property
    def held(self) -> int:
        return len(self._held)
