"""omni_ray/metrics.py without Ray: request tracking and engine gauges on fake instruments."""

from __future__ import annotations

from omni_ray.metrics import EngineMetrics, RequestStatus, RequestTrack, modality_tag


class Fake:
    def __init__(self):
        self.calls = []

    def observe(self, v, tags=None):
        self.calls.append(("observe", v, tags))

    def inc(self, v=1, tags=None):
        self.calls.append(("inc", v, tags))

    def set(self, v, tags=None):
        self.calls.append(("set", v, tags))


class FakeIngress:
    def __init__(self):
        self.ttft, self.ttfa, self.requests, self.aborts, self.errors = (Fake() for _ in range(5))


def test_modality_tag_is_one_spelling_per_set():
    assert modality_tag(["text", "audio"]) == modality_tag(("audio", "text")) == "audio+text"
    assert modality_tag(None) == "text"


def test_track_counts_once_and_times_first_items_only():
    m = FakeIngress()
    t = RequestTrack(m, "audio+text")
    t.on_text(), t.on_text(), t.on_audio(), t.on_audio()
    t.finish(RequestStatus.ERROR, "talker")
    t.finish(RequestStatus.OK)  # ignored: a request ends once
    assert len(m.ttft.calls) == len(m.ttfa.calls) == 1
    assert m.requests.calls == [("inc", 1, {"status": "error", "modality": "audio+text"})]
    assert m.errors.calls == [("inc", 1, {"cause": "talker"})] and not m.aborts.calls


def test_track_abort_and_ok():
    m = FakeIngress()
    RequestTrack(m, "text").finish(RequestStatus.ABORTED, "client_disconnect")
    RequestTrack(m, "text").finish(RequestStatus.OK)
    assert m.aborts.calls == [("inc", 1, {"cause": "client_disconnect"})]
    assert [c[2]["status"] for c in m.requests.calls] == ["aborted", "ok"] and not m.errors.calls


def _engine_metrics() -> EngineMetrics:
    import threading

    em = EngineMetrics.__new__(EngineMetrics)  # instruments replaced by fakes: no Ray needed
    em.batch, em.running, em.queue_depth, em._last = Fake(), Fake(), Fake(), (-1, -1)
    em._lock = threading.Lock()
    return em


def test_engine_gauges_only_on_change():
    em = _engine_metrics()
    em.on_step(3, range(5))
    em.on_step(3, range(5))
    em.on_idle(range(2))
    assert len(em.batch.calls) == 2
    assert [c[1] for c in em.running.calls] == [3, 0]
    assert [c[1] for c in em.queue_depth.calls] == [2, 2]


def test_engine_gauges_follow_the_table_after_idle():
    """The loop goes idle while the finished request is still in the table; dropping it later
    must bring the waiting count to 0 (it stayed at its last value before)."""
    em = _engine_metrics()
    table = {"a": 1, "b": 2}
    em.on_step(2, table)
    em.on_idle(table)           # both finished, not yet removed: 2 "waiting"
    del table["a"]
    em.on_requests(table)
    del table["b"]
    em.on_requests(table)
    assert em.running.calls[-1][1] == 0 and em.queue_depth.calls[-1][1] == 0
    assert [c[1] for c in em.queue_depth.calls] == [0, 2, 1, 0]
