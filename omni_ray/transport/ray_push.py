"""Object-ref push between stage engine actors.

The producer calls the consumer's ``push`` with the chunk encoded by the wire codec (a numpy
buffer: inlined in the call when small, a zero-copy object-store read when large). Per request:

* ``ChunkSender`` keeps chunks in order and at most ``max_in_flight`` pushes unacknowledged; it
  awaits every push it made, so no object ref outlives the request, and reports a failed push
  (e.g. the receiving engine died) to its owner instead of hanging;
* ``Reorderer`` on the receiving side releases chunks strictly by ``seq`` and rejects duplicates
  (nothing dropped silently, nothing applied twice);
* ``PushBatcher`` (shared by an engine's senders) sends the chunks pushed in one turn of the
  event loop to the same receiver in one call: an engine's step wakes every request's sender at
  once, and one actor call costs each side a few hundred us of CPU, much of it holding the GIL
  the receiver's step thread needs (benchmarks/push_fanin_bench.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from functools import partial

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
                 attach_timeout_s: float = 5.0, batcher: PushBatcher | None = None):
        """``downstream``: the receiver, or a future of it (the chunks wait for it, at most
        ``attach_timeout_s`` from the first; then the sender fails like a failed push).
        ``batcher``: pushes go through it (one call per receiver and turn of the loop, with
        other requests' chunks); None: one ``push`` call per chunk."""
        self.downstream = downstream
        self._batcher = batcher
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
        if self._batcher is not None:
            fut = self._batcher.push(self.downstream, buf)
        else:
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


class PushBatcher:
    """One call per receiver for the chunks pushed in one turn of the event loop.

    ``push(receiver, buf)`` returns a future of that chunk's answer (the receiver's ``push``
    result: False if it no longer knows the request). The chunks pushed to one receiving actor
    before the loop comes round go in one ``push_many(bufs)`` call (a lone chunk in ``push``),
    in the order pushed, so each request's chunks keep their order; a failed call fails the
    future of every chunk in it. Receivers are told apart by actor id: each request holds its
    own handle of the same engine. ``calls`` / ``chunks``: how many calls carried how many
    chunks, so far."""

    def __init__(self):
        self._groups: dict = {}  # receiver key -> (receiver, [(buf, future)])
        self._calls: set = set()  # calls in flight (a reference keeps each alive)
        self._flushing = False
        self.calls = 0
        self.chunks = 0

    def push(self, receiver, buf) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        key = _actor_key(receiver)
        if key not in self._groups:
            self._groups[key] = (receiver, [])
        self._groups[key][1].append((buf, fut))
        if not self._flushing:
            self._flushing = True
            loop.call_soon(self._flush)
        return fut

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def _flush(self) -> None:
        groups, self._groups, self._flushing = self._groups, {}, False
        for receiver, items in groups.values():
            bufs, futs = [b for b, _ in items], [f for _, f in items]
            self.calls += 1
            self.chunks += len(bufs)
            try:
                ref = receiver.push.remote(bufs[0]) if len(bufs) == 1 else \
                    receiver.push_many.remote(bufs)
                call = asyncio.ensure_future(ref)
            except Exception as e:  # noqa: BLE001 - e.g. a receiver without push_many
                for fut in futs:  # its senders fail now, they must not wait for an answer
                    if not fut.done():
                        fut.set_exception(e)
                continue
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
            call.add_done_callback(partial(_answer, futs, len(bufs) == 1))


def _actor_key(receiver):
    actor_id = getattr(receiver, "_actor_id", None)  # Ray's ActorHandle
    return actor_id.hex() if actor_id is not None else id(receiver)


def _answer(futs: list[asyncio.Future], single: bool, call: asyncio.Future) -> None:
    """The chunks' futures from their call: each its own answer, or the call's failure."""
    if call.cancelled():
        for fut in futs:
            fut.cancel()
        return
    error, answers = call.exception(), None
    if error is None:
        answers = [call.result()] if single else call.result()
        if not isinstance(answers, list) or len(answers) != len(futs):
            error = RuntimeError(f"push_many answered {answers!r} for {len(futs)} chunks")
    for i, fut in enumerate(futs):
        if fut.done():  # its sender gave up on it (cancelled)
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(answers[i])


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
