"""ChunkSender without Ray: acknowledgements, round-trip timing, and a failed push."""

from __future__ import annotations

import asyncio

import pytest

from omni_ray.payload import ThinkerChunk
from omni_ray.transport.ray_push import ChunkSender


class Downstream:
    """``push.remote(buf)`` like an actor handle; fails from push ``fail_at`` on."""

    def __init__(self, fail_at: int | None = None):
        self.got, self.fail_at = 0, fail_at
        self.push = self

    def remote(self, buf):
        self.got += 1
        n = self.got

        async def ack():
            await asyncio.sleep(0)
            if self.fail_at is not None and n >= self.fail_at:
                raise ConnectionError("receiver died")
            return True
        return ack()


def chunk(i: int) -> ThinkerChunk:
    return ThinkerChunk(request_id="r", seq=i, token_ids=[i])


def test_every_push_acked_and_timed():
    async def run():
        acks, errors = [], []
        s = ChunkSender(Downstream(), max_in_flight=2, on_ack=lambda t, n: acks.append((t, n)),
                        on_error=errors.append)
        for i in range(5):
            s.send(chunk(i))
        s.close()
        await asyncio.wait_for(s.wait(), 5)
        return s, acks, errors

    s, acks, errors = asyncio.run(run())
    assert len(acks) == s.chunks_sent == 5 and not errors and s.in_flight == 0
    assert sum(n for _, n in acks) == s.bytes_sent and all(t >= 0 for t, _ in acks)


def test_failed_push_reports_once_and_does_not_hang():
    async def run():
        errors = []
        s = ChunkSender(Downstream(fail_at=2), max_in_flight=8, on_error=errors.append)
        for i in range(4):
            s.send(chunk(i))
        s.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(s.wait(), 5)
        s.send(chunk(9))  # after the failure: dropped, never pushed
        return s, errors

    s, errors = asyncio.run(run())
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
    assert s.done and s.in_flight == 0 and isinstance(s.error, ConnectionError)


def test_a_later_downstream_gets_the_chunks_sent_before_it_came_in_order():
    """``DOWNSTREAM_LATER`` (stages/engine.py): the sender holds a future of the receiver; the
    chunks sent before it resolves wait, then go in order."""
    async def run():
        later = asyncio.get_running_loop().create_future()
        s = ChunkSender(later, max_in_flight=2)
        for i in range(3):
            s.send(chunk(i))
        await asyncio.sleep(0.05)
        assert s.chunks_sent == 0  # waiting for the receiver
        receiver = Downstream()
        later.set_result(receiver)
        s.send(chunk(3))
        s.close()
        await asyncio.wait_for(s.wait(), 5)
        return s, receiver

    s, receiver = asyncio.run(run())
    assert s.chunks_sent == receiver.got == 4 and s.error is None


def test_a_downstream_that_never_comes_fails_the_sender_after_the_first_chunk():
    async def run():
        errors = []
        later = asyncio.get_running_loop().create_future()
        s = ChunkSender(later, on_error=errors.append, attach_timeout_s=0.2)
        await asyncio.sleep(0.3)  # nothing to send yet: no clock running
        assert not s.done
        s.send(chunk(0))
        with pytest.raises(TimeoutError, match="no next stage attached within 0.2 s"):
            await asyncio.wait_for(s.wait(), 5)
        return errors

    errors = asyncio.run(run())
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError)
