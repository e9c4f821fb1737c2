"""PushBatcher: the chunks an engine's senders push in one turn of the event loop go to each
receiving engine in one call, each request's in order, each chunk with its own answer; a failed
call fails every sender in it once. Without Ray (receivers that record their calls), then with
real Ray actors (two handles of one actor are one receiver)."""

from __future__ import annotations

import asyncio

import pytest

from omni_ray.payload import ThinkerChunk, decode_chunk
from omni_ray.transport.ray_push import ChunkSender, PushBatcher


class Receiver:
    """``push.remote(buf)`` / ``push_many.remote(bufs)`` like an engine's actor handle: records
    each call's chunks; answers False for ``unknown`` requests; fails every call with ``fail``."""

    def __init__(self, unknown=(), fail: bool = False):
        self.calls: list[list[ThinkerChunk]] = []
        self.unknown, self.fail = set(unknown), fail
        self.push = _Method(self, many=False)
        self.push_many = _Method(self, many=True)

    def answer(self, bufs):
        chunks = [decode_chunk(b) for b in bufs]
        self.calls.append(chunks)

        async def reply():
            await asyncio.sleep(0)
            if self.fail:
                raise ConnectionError("receiver died")
            return [c.request_id not in self.unknown for c in chunks]
        return reply()


class _Method:
    def __init__(self, receiver: Receiver, many: bool):
        self.receiver, self.many = receiver, many

    def remote(self, arg):
        coro = self.receiver.answer(arg if self.many else [arg])
        if self.many:
            return coro

        async def one():
            return (await coro)[0]
        return one()


def chunk(rid: str, i: int) -> ThinkerChunk:
    return ThinkerChunk(request_id=rid, seq=i, token_ids=[i])


def _send_all(senders: dict, per_request: int) -> None:
    for rid, s in senders.items():
        for i in range(per_request):
            s.send(chunk(rid, i))
        s.close()


def test_one_turns_chunks_go_in_one_call_per_receiver_in_order():
    async def run():
        a, b = Receiver(), Receiver()
        batcher = PushBatcher()
        acks = []
        senders = {f"r{i}": ChunkSender(a if i < 5 else b, max_in_flight=8, batcher=batcher,
                                        on_ack=lambda t, n: acks.append(n))
                   for i in range(8)}
        _send_all(senders, 3)
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in senders.values())), 5)
        return a, b, batcher, senders, acks

    a, b, batcher, senders, acks = asyncio.run(run())
    # every request's 3 chunks, sent in the same turn, in one call to its receiver
    assert [len(c) for c in a.calls] == [15] and [len(c) for c in b.calls] == [9]
    assert batcher.calls == 2 and batcher.chunks == 24 and batcher.in_flight == 0
    for receiver in (a, b):
        by_request: dict[str, list[int]] = {}
        for c in receiver.calls[0]:
            by_request.setdefault(c.request_id, []).append(c.seq)
        assert all(seqs == [0, 1, 2] for seqs in by_request.values()), by_request
    assert len(acks) == 24 and all(s.error is None and not s.rejected for s in senders.values())


def test_each_chunk_gets_its_own_answer():
    """A receiver that no longer knows one request rejects its chunks only."""
    async def run():
        r = Receiver(unknown={"gone"})
        batcher = PushBatcher()
        senders = {rid: ChunkSender(r, batcher=batcher) for rid in ("gone", "here")}
        _send_all(senders, 2)
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in senders.values())), 5)
        return r, senders

    r, senders = asyncio.run(run())
    assert len(r.calls) == 1
    assert senders["gone"].rejected and not senders["here"].rejected


def test_a_failed_call_fails_every_sender_in_it_once():
    async def run():
        r = Receiver(fail=True)
        batcher = PushBatcher()
        errors: dict[str, list] = {}
        senders = {rid: ChunkSender(r, batcher=batcher,
                                    on_error=lambda e, rid=rid: errors.setdefault(rid, []).append(e))
                   for rid in ("x", "y", "z")}
        _send_all(senders, 2)
        for s in senders.values():
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(s.wait(), 5)
        return errors, senders, batcher

    errors, senders, batcher = asyncio.run(run())
    assert {rid: len(e) for rid, e in errors.items()} == {"x": 1, "y": 1, "z": 1}
    assert all(s.done and s.in_flight == 0 for s in senders.values())
    assert batcher.in_flight == 0


def test_a_call_that_cannot_be_made_fails_its_senders_instead_of_leaving_them_waiting():
    """A receiver without ``push_many`` (not a stage engine): the call raises as it is made,
    inside the loop's callback; every sender in it fails, none hangs."""
    class OnlyPush(Receiver):
        def __init__(self):
            super().__init__()
            del self.push_many

    async def run():
        r = OnlyPush()
        batcher = PushBatcher()
        senders = {rid: ChunkSender(r, batcher=batcher) for rid in ("a", "b")}
        _send_all(senders, 1)
        for s in senders.values():
            with pytest.raises(AttributeError):
                await asyncio.wait_for(s.wait(), 5)
        return senders

    senders = asyncio.run(run())
    assert all(s.done and isinstance(s.error, AttributeError) for s in senders.values())


def test_a_cancelled_sender_leaves_the_others_of_its_call_answered():
    async def run():
        r = Receiver()
        batcher = PushBatcher()
        senders = {rid: ChunkSender(r, batcher=batcher) for rid in ("keep", "drop")}
        _send_all(senders, 2)
        await asyncio.sleep(0)  # both senders pushed; the call is not made yet
        senders["drop"].cancel()
        await asyncio.wait_for(senders["keep"].wait(), 5)
        await asyncio.sleep(0.01)
        return senders, batcher

    senders, batcher = asyncio.run(run())
    assert senders["keep"].error is None and senders["keep"].chunks_sent == 2
    assert senders["drop"].in_flight == 0 and batcher.in_flight == 0


def test_ray_actor_handles_of_one_engine_share_a_call(ray_cluster):
    """Each request holds its own handle of the downstream engine (deserialized with its
    add_request): the batcher tells receivers apart by actor id, so they share a call."""
    import ray

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self):
            self.calls = []

        async def push(self, buf) -> bool:
            self.calls.append([decode_chunk(buf).request_id])
            return True

        async def push_many(self, bufs) -> list[bool]:
            self.calls.append([decode_chunk(b).request_id for b in bufs])
            return [True] * len(bufs)

        def got(self):
            return self.calls

    @ray.remote(num_cpus=0)
    class Upstream:
        async def run(self, *handles) -> tuple[int, int]:
            assert len({id(h) for h in handles}) == len(handles)  # a handle each
            # self-contained: this test module is not importable in a Ray worker
            from omni_ray.payload import ThinkerChunk
            from omni_ray.transport.ray_push import ChunkSender, PushBatcher

            batcher = PushBatcher()
            senders = [ChunkSender(h, batcher=batcher) for h in handles]
            for i, s in enumerate(senders):
                for k in range(2):
                    s.send(ThinkerChunk(request_id=f"r{i}", seq=k, token_ids=[k]))
                s.close()
            await asyncio.gather(*(s.wait() for s in senders))
            return batcher.calls, batcher.chunks

    engine = Engine.remote()
    # four requests, each with a handle of its own (each argument is deserialized apart)
    calls, chunks = ray.get(Upstream.remote().run.remote(engine, engine, engine, engine))
    got = ray.get(engine.got.remote())
    assert (calls, chunks) == (1, 8) and len(got) == 1 and sorted(set(got[0])) == [
        "r0", "r1", "r2", "r3"]
