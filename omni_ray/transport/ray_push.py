"""Object-ref push between stage engine actors.

The producer calls the consumer's ``push`` with the chunk encoded by the wire codec (a numpy
buffer: inlined in the call when small, a zero-copy object-store read when large). Per request:

* ``ChunkSender`` keeps chunks in order and at most ``max_in_flight`` pushes unacknowledged; it
  awaits every push it made, so no object ref outlives the request;
* ``Reorderer`` on the receiving side releases chunks strictly by ``seq`` and rejects duplicates
  (nothing dropped silently, nothing applied twice).
"""

from __future__ import annotations

import asyncio
from collections import deque

from omni_ray.payload import encode_chunk


class ChunkSender:
    """Ordered, bounded push of one request's chunks to a downstream actor."""

    def __init__(self, downstream, max_in_flight: int = 8):
        self.downstream = downstream
        self.max_in_flight = max_in_flight
        self._queue: asyncio.Queue = asyncio.Queue()
        self._in_flight: deque = deque()
        self.bytes_sent = 0
        self.chunks_sent = 0
        self.rejected = False  # the receiver no longer knows the request
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(self, chunk) -> None:
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
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # we were cancelled, not the sender

    def cancel(self) -> None:
        self._task.cancel()
        self._in_flight.clear()

    async def _run(self) -> None:
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                break
            if self.rejected:
                continue
            buf = encode_chunk(chunk)
            self.bytes_sent += buf.nbytes
            self.chunks_sent += 1
            self._in_flight.append(self.downstream.push.remote(buf))
            while len(self._in_flight) >= self.max_in_flight:
                await self._ack()
        while self._in_flight:
            await self._ack()

    async def _ack(self) -> None:
        accepted = await self._in_flight.popleft()
        if accepted is False:
            self.rejected = True


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
