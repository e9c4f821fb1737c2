"""The ingress's KV hand-off (omni_ray/ingress/kv_client.py) against small fakes of the Serve
handles: every state's failure, fallback vs error, ambiguous loads, aborts and cancellation, and
that the ingress never keeps the object ref. The real thing runs in tests/serve/test_kv_disagg.py.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import ThinkerDisaggConfig
from omni_ray.ingress import kv_client
from omni_ray.ingress.kv_client import DisaggPipelineClient, KVInjectedAbort
from omni_ray.ingress.pipeline_client import StageError
from omni_ray.kv_lifecycle import KVLoadError, KVState, KVTransferError
from omni_ray.testing.faults import KVFault
from omni_ray.transport.kv_ref import KVHandle, KVProgress

REQ = OmniRequest(request_id="r1", prompt_token_ids=[1, 2, 3], modalities=("text",))
HANG = "hang"  # a step that never answers


class Ref:
    """Stands in for the object-store ref; weakref-able so tests can see that nobody keeps it."""


class Call:
    """A fake streaming handle call: ``__anext__`` over scripted items, ``cancel``; ``settled``
    once cancelled or read to its end (``drained``: how the ingress ends a prefill stream)."""

    def __init__(self, items):
        self.items, self.cancelled, self.drained = list(items), False, False

    @property
    def settled(self) -> bool:
        return self.cancelled or self.drained

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            self.drained = True
            raise StopAsyncIteration
        item = self.items.pop(0)
        if item == HANG:
            await asyncio.sleep(3600)
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self):
        self.cancelled = True


class Method:
    def __init__(self, make):
        self.make, self.calls = make, []

    def remote(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.make(*args, **kwargs)


class Deployment:
    def __init__(self, **methods):
        for name, make in methods.items():
            setattr(self, name, Method(make))

    def options(self, **_):
        return self


class Engine:
    """The decode engine handle: ``fetch_kv`` / ``load_kv`` answer, raise or hang."""

    def __init__(self, fetch=None, load=None):
        self.fetch_kv = Method(lambda *a: _answer(fetch, {"nbytes": 1}))
        self.load_kv = Method(lambda *a: _answer(load, {"seconds": 0.0}))
        self.abort = Method(lambda *a: None)  # the ingress's own abort (abort_stages)


async def _answer(behaviour, ok):
    if behaviour == HANG:
        await asyncio.sleep(3600)
    if isinstance(behaviour, BaseException):
        raise behaviour
    return ok


class World:
    """A prefill deployment, a decode deployment and its engine, scripted per test."""

    def __init__(self, prefill_items=None, fetch=None, load=None, fallback="local_prefill",
                 decode="ends"):
        self.ref = Ref()
        handle = KVHandle("r1", self.ref, 3, 100, 7)
        self.prefill_items = prefill_items if prefill_items is not None else [
            KVProgress("r1", KVState.HELD, 7, 3, 0.0),
            KVProgress("r1", KVState.EXTRACTED, 7, 3, 0.0, handle)]
        del handle
        self.engine = Engine(fetch, load)
        self.calls: list[Call] = []
        self.prefill = Deployment(prefill=lambda *a: self._call(self.prefill_items))
        # the hand-off's decode call (the fallback's always ends): it yields the engine and ends
        # (the engine ended the request), or never ends, or never yields the engine
        self.decode = decode
        self.settled_at_open: list[list[tuple[bool, bool]]] = []  # (drained, cancelled) so far
        self.decode_deployment = Deployment(open=self._decode_open)
        cfg = ThinkerDisaggConfig(fallback=fallback,
                                  timeouts={"prefill_s": 0.3, "transfer_s": 0.2, "load_s": 0.2})
        self.client = DisaggPipelineClient(self.prefill, self.decode_deployment, None, None, cfg)

    def _decode_open(self, *a, **kw):
        self.settled_at_open.append([(c.drained, c.cancelled) for c in self.calls])
        how = self.decode if kw.get("expect_kv") else "ends"
        return self._call({"ends": [self.engine], "never_ends": [self.engine, HANG],
                           "never_opens": [HANG]}[how])

    def _call(self, items):
        c = Call(items)
        self.calls.append(c)
        return c

    def open(self, fault: str | None = None):
        async def main():
            try:
                return await self.client.open(REQ, kv_fault=KVFault.parse(fault) if fault else None)
            finally:  # the prefill streams the ingress reads to their end in the background
                await asyncio.gather(*self.client._drains, return_exceptions=True)

        return asyncio.run(main())

    def transfer(self) -> dict:
        return self.client.transfers.recent[-1]

    def ref_dropped(self) -> bool:
        r = weakref.ref(self.ref)
        self.ref = None
        self.prefill_items = None
        for c in self.calls:  # unconsumed items of a cancelled call (Serve drops those)
            c.items = []
        gc.collect()
        return r() is None

    @property
    def decode_opens(self) -> list[dict]:
        return [kw for _, kw in self.decode_deployment.open.calls]


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(kv_client, "GRACE_S", 0.05)


def assert_nothing_live(w: World):
    s = w.client.stats()
    assert s["kv_transfers_live"] == 0 and s["kv_refs_held"] == 0
    assert w.client._faults == {}


def test_success_hands_off_and_drops_the_ref():
    w = World()
    stream = w.open()
    t = w.transfer()
    assert (t["state"], t["fallback"], t["num_tokens"], t["nbytes"]) == ("RELEASED", False, 3, 100)
    assert w.decode_opens == [{"expect_kv": True}]
    assert len(w.engine.fetch_kv.calls) == 1 and len(w.engine.load_kv.calls) == 1
    decode_call = w.calls[1]
    assert stream._gens == [("thinker", decode_call)] and not decode_call.cancelled
    assert w.calls[0].drained and not w.calls[0].cancelled  # the prefill stream read to its end
    stream.close()
    assert_nothing_live(w)
    w.engine.fetch_kv.calls.clear()  # the fake engine's call log is the only other holder
    assert w.ref_dropped()


FAILS = {  # how each step fails -> (World kwargs, state it failed in)
    "prefill_error": (dict(prefill_items=[RuntimeError("engine died")]), "REQUESTED"),
    "prefill_timeout": (dict(prefill_items=[HANG]), "REQUESTED"),
    "extract_error": (dict(prefill_items=[KVProgress("r1", KVState.HELD, 7, 3, 0.0),
                                          RuntimeError("KVExtractError")]), "HELD"),
    "stream_ends": (dict(prefill_items=[]), "REQUESTED"),
    "fetch_error": (dict(fetch=KVTransferError("owner died")), "EXTRACTED"),
    "fetch_timeout": (dict(fetch=HANG), "EXTRACTED"),
    "load_error": (dict(load=KVLoadError("bad cache")), "TRANSFERRED"),
}


@pytest.mark.parametrize("case", list(FAILS))
def test_clean_failure_falls_back_to_a_local_prefill(case):
    kwargs, state = FAILS[case]
    w = World(**kwargs)
    stream = w.open()
    t = w.transfer()
    assert (t["state"], t["failed_at"], t["fallback"]) == ("FAILED", state, True)
    assert w.decode_opens[-1] == {}  # the fallback: an ordinary thinker open
    assert stream._gens[0][1] is w.calls[-1]
    assert all(c.settled for c in w.calls[:-1])  # every hand-off call cancelled or read out
    if state in ("EXTRACTED", "TRANSFERRED"):  # the decode replica had the request
        # its call was read to its end, never cancelled, before the fallback opened the same
        # id: a cancel's abort still on its way would refuse or kill the local prefill
        assert w.settled_at_open[-1][1] == (True, False)
    stream.close()
    assert_nothing_live(w)
    w.engine.fetch_kv.calls.clear()
    assert w.ref_dropped()


@pytest.mark.parametrize("case", list(FAILS))
def test_error_policy_ends_the_request_naming_the_state(case):
    kwargs, state = FAILS[case]
    w = World(fallback="error", **kwargs)
    with pytest.raises(StageError, match=f"KV hand-off failed at {state}") as err:
        w.open()
    assert err.value.stage == "thinker"
    assert all(c.settled for c in w.calls)
    assert len(w.decode_opens) <= 1
    assert_nothing_live(w)
    assert w.client.stats()["kv_failed"] == 1


@pytest.mark.parametrize("load", [HANG, RuntimeError("decode actor died")], ids=["timeout", "died"])
def test_an_ambiguous_load_never_falls_back(load):
    """The decode runner may have started: a second thinker stream could duplicate chunks."""
    w = World(load=load)
    with pytest.raises(StageError, match="KV hand-off failed at TRANSFERRED"):
        w.open()
    assert w.transfer()["fallback"] is False and len(w.decode_opens) == 1
    assert all(c.settled for c in w.calls)
    assert_nothing_live(w)


@pytest.mark.parametrize("decode", ["never_ends", "never_opens"])
def test_an_unsettled_decode_attempt_never_falls_back(decode):
    """The decode replica keeps (or may yet register) the request's id: a local prefill of the
    same id there would race its end, so the request ends with the hand-off's error."""
    w = World(load=KVLoadError("bad cache"), decode=decode)
    with pytest.raises(StageError, match="KV hand-off failed at "):
        w.open()
    assert w.transfer()["fallback"] is False and len(w.decode_opens) == 1
    assert w.calls[-1].cancelled
    assert_nothing_live(w)


@pytest.mark.parametrize("state", ["REQUESTED", "HELD", "EXTRACTED", "TRANSFERRED", "LOADED",
                                   "RELEASED"])
def test_abort_at_each_state_settles_every_call(state):
    w = World()
    with pytest.raises(KVInjectedAbort, match=f"aborted at {state}"):
        w.open(f"abort_at:{state}")
    t = w.transfer()
    if state == "RELEASED":
        assert t["state"] == "RELEASED"
    else:
        assert (t["state"], t["failed_at"]) == ("ABORTED", state)
    assert w.calls and all(c.settled for c in w.calls)
    assert w.calls[0].drained  # the prefill stream read to its end, never dropped mid-way
    assert_nothing_live(w)
    w.engine.fetch_kv.calls.clear()
    assert w.ref_dropped()


def test_client_cancel_mid_transfer_aborts():
    w = World(fetch=HANG)

    async def main():
        task = asyncio.create_task(w.client.open(REQ))
        await asyncio.sleep(0.05)  # inside fetch_kv
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    t = w.transfer()
    assert (t["state"], t["failed_at"]) == ("ABORTED", "EXTRACTED")
    assert all(c.settled for c in w.calls)
    assert_nothing_live(w)


def test_kv_fault_header():
    w = World()
    assert kv_client.kv_fault_from_header(None, w.client) is None
    assert kv_client.kv_fault_from_header("load_fails", w.client) == KVFault(kind="load_fails")
    with pytest.raises(ValueError):
        kv_client.kv_fault_from_header("abort_at:LATER", w.client)
    from omni_ray.ingress.pipeline_client import PipelineClient

    with pytest.raises(ValueError, match="not enabled"):
        kv_client.kv_fault_from_header("load_fails", PipelineClient(None, None, None))
