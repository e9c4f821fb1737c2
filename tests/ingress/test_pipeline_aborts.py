"""The ingress aborts a request in every stage's engine itself when the request ends before its
stages do, without relying on Serve's cancel of the stage calls, which can be lost
(benchmarks/serve_cancel_race.py): directly on the engine each call named first, else through the
stage's deployment and on every engine of that stage the ingress saw lately (a stage of several
replicas). A request whose stages all ended is not aborted anywhere."""

from __future__ import annotations

import asyncio

from omni_ray.ingress.pipeline_client import PipelineStream
from omni_ray.ingress.stage_aborts import StageReach, abort_stages

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


NAMES = ("code2wav", "talker", "thinker")


def stages():
    return ([(n, Call([[]])) for n in NAMES], {n: Engine() for n in NAMES},
            StageReach({n: Deployment() for n in NAMES}))


async def settle(done, tries: int = 200):
    """Wait for the background aborts (at most ``tries`` x 10 ms) until ``done()``."""
    for _ in range(tries):
        if done():
            return
        await asyncio.sleep(0.01)


def test_a_stream_left_before_its_end_aborts_every_engine():
    gens, engines, reach = stages()

    async def leave_after_opening():
        stream = PipelineStream(gens, RID, engines, reach)
        stream.close()  # the client left: nothing read

    asyncio.run(leave_after_opening())
    assert all(g.cancelled for _, g in gens)
    assert {n: e.aborted for n, e in engines.items()} == {n: [RID] for n in engines}
    assert all(h.aborted == [] for h in reach.handles.values())  # the engines were known


def test_a_stream_read_to_its_end_aborts_nothing():
    gens, engines, reach = stages()

    async def read_all():
        stream = PipelineStream(gens, RID, engines, reach)
        assert [x async for x in stream] == []
        stream.close()

    asyncio.run(read_all())
    assert all(e.aborted == [] for e in engines.values())
    assert all(h.aborted == [] for h in reach.handles.values())


def test_a_call_that_named_no_engine_is_aborted_through_its_deployment():
    gens, engines, reach = stages()
    del engines["talker"]  # its first item never came (the open was cut short)
    engines["code2wav"] = None  # its call failed (refused): nothing is open there
    handles = reach.handles

    async def cut_short():
        abort_stages(RID, gens, engines, reach)
        await settle(lambda: handles["talker"].aborted)

    asyncio.run(cut_short())
    assert handles["talker"].aborted == [RID]
    assert engines["thinker"].aborted == [RID]
    assert handles["code2wav"].aborted == [] and handles["thinker"].aborted == []


def test_a_stage_of_two_replicas_is_aborted_on_both_engines_seen():
    """Serve sends the deployment's abort to one replica; the request may be on the other."""
    gens, engines, reach = stages()
    earlier = [Engine(), Engine()]  # the talker's two replicas, named by earlier requests
    reach.note({"talker": earlier[0], "code2wav": None})
    reach.note({"talker": earlier[1]})
    reach.note({"talker": earlier[0]})  # named again: still one entry
    assert reach.recent("talker") == [earlier[1], earlier[0]] and reach.recent("code2wav") == []
    del engines["talker"]

    async def cut_short():
        abort_stages(RID, gens, engines, reach)
        await settle(lambda: all(e.aborted for e in earlier) and reach.handles["talker"].aborted)

    asyncio.run(cut_short())
    assert [e.aborted for e in earlier] == [[RID], [RID]]
    assert reach.handles["talker"].aborted == [RID]  # a replica not seen yet
    assert engines["code2wav"].aborted == [RID] and engines["thinker"].aborted == [RID]


def test_engines_not_named_lately_are_forgotten():
    reach = StageReach({"talker": Deployment()}, recent_s=60.0, keep=2)
    old, a, b = Engine(), Engine(), Engine()
    reach.note({"talker": old})
    reach._seen["talker"][old] -= 61.0  # named 61 s ago: restarted or gone since
    assert reach.recent("talker") == []
    reach.note({"talker": a})
    reach.note({"talker": b})  # keep=2: the oldest entry makes room
    assert reach.recent("talker") == [a, b] and old not in reach._seen["talker"]


class Stage:
    """A stage's deployment for ``PipelineClient``: each ``open`` call names ``engine`` first,
    or fails with ``error`` before naming any."""

    def __init__(self, engine=None, error: Exception | None = None):
        self.engine, self.error = engine, error
        self.open = self

    def options(self, **_):
        return self

    def remote(self, req, downstream):
        return Failing(self.error) if self.error else Call([self.engine])


class Failing(Call):
    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    async def __anext__(self):
        raise self.error


def test_a_real_client_remembers_the_engines_its_requests_named():
    """``PipelineClient.open`` notes each stage call's engine, on success and when it fails."""
    import pytest

    from omni_ray.config.request import OmniRequest
    from omni_ray.ingress.pipeline_client import PipelineClient

    engine = Engine()
    client = PipelineClient(Stage(engine), None, None)
    req = OmniRequest(request_id=RID, prompt_token_ids=[1, 2, 3], modalities=["text"])

    async def text_only():
        stream = await client.open(req)
        stream.close()

    asyncio.run(text_only())
    assert client.reach.recent("thinker") == [engine]
    assert engine.aborted == [RID]  # closed before its end

    # with speech: code2wav refuses (a bad input, before naming its engine), the others named
    # theirs; the open fails, aborts the request on the two engines and remembers both
    thinker, talker = Engine(), Engine()
    client = PipelineClient(Stage(thinker), Stage(talker), Stage(error=ValueError("bad voice")))
    spoken = OmniRequest(request_id="chatcmpl-spoken", prompt_token_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="bad voice"):
        asyncio.run(client.open(spoken))
    assert client.reach.recent("thinker") == [thinker]
    assert client.reach.recent("talker") == [talker] and client.reach.recent("code2wav") == []
    assert thinker.aborted == talker.aborted == ["chatcmpl-spoken"]
