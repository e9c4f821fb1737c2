"""The ingress aborts a request in every stage's engine itself when the request ends before its
stages do, without relying on Serve's cancel of the stage calls, which can be lost
(benchmarks/serve_cancel_race.py): directly on the engine each call named first, else through the
stage's deployment. A request whose stages all ended is not aborted anywhere."""

from __future__ import annotations

import asyncio

from omni_ray.ingress.pipeline_client import PipelineStream, abort_stages

RID = "chatcmpl-abc"


class Engine:
    """An engine actor handle: its ``abort.remote`` calls."""

    def __init__(self):
        self.aborted: list[str] = []
        self.abort = self

    def remote(self, rid):
        self.aborted.append(rid)


class Deployment:
    """A stage's deployment handle: its ``abort`` calls, awaited."""

    def __init__(self):
        self.aborted: list[str] = []
        self.abort = self

    async def remote(self, rid):
        self.aborted.append(rid)
        return False


class Call:
    """A stage call (a Serve response generator): ``items`` lists, then its end."""

    def __init__(self, items=()):
        self.items, self.cancelled = list(items), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self):
        self.cancelled = True


def stages():
    names = ("code2wav", "talker", "thinker")
    return ([(n, Call([[]])) for n in names], {n: Engine() for n in names},
            {n: Deployment() for n in names})


def test_a_stream_left_before_its_end_aborts_every_engine():
    gens, engines, handles = stages()

    async def leave_after_opening():
        stream = PipelineStream(gens, RID, engines, handles)
        stream.close()  # the client left: nothing read

    asyncio.run(leave_after_opening())
    assert all(g.cancelled for _, g in gens)
    assert {n: e.aborted for n, e in engines.items()} == {n: [RID] for n in engines}
    assert all(h.aborted == [] for h in handles.values())  # the engines were known


def test_a_stream_read_to_its_end_aborts_nothing():
    gens, engines, handles = stages()

    async def read_all():
        stream = PipelineStream(gens, RID, engines, handles)
        assert [x async for x in stream] == []
        stream.close()

    asyncio.run(read_all())
    assert all(e.aborted == [] for e in engines.values())
    assert all(h.aborted == [] for h in handles.values())


def test_a_call_that_named_no_engine_is_aborted_through_its_deployment():
    gens, engines, handles = stages()
    del engines["talker"]  # its first item never came (the open was cut short)
    engines["code2wav"] = None  # its call failed (refused): nothing is open there

    async def cut_short():
        abort_stages(RID, gens, engines, handles)
        for _ in range(200):  # the deployment's abort runs in the background
            if handles["talker"].aborted:
                break
            await asyncio.sleep(0.01)

    asyncio.run(cut_short())
    assert handles["talker"].aborted == [RID]
    assert engines["thinker"].aborted == [RID]
    assert handles["code2wav"].aborted == [] and handles["thinker"].aborted == []
