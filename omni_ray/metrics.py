"""Prometheus metrics of omni_ray; every name starts with ``omni_ray_`` (see docs/metrics.md).

Ray exports them on each node's metrics export port and adds its own ``ray_`` prefix
(``omni_ray_requests_total`` is scraped as ``ray_omni_ray_requests_total``). The ingress records
through ``ray.serve.metrics``, which adds the deployment, replica and application tags; engine
actors are not Serve replicas and record through ``ray.util.metrics`` with a ``stage`` tag.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sized
from enum import Enum

LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
CHUNK_LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]

# The edge a stage's chunks travel on (the stage sends, the next one accepts); the thinker's
# decode half sends on the thinker's edge; other engines (the prefill) are "<stage>->next".
EDGES = {"thinker": "thinker->talker", "thinker_decode": "thinker->talker",
         "talker": "talker->code2wav"}


class RequestStatus(str, Enum):
    """How an ingress request ended (the ``status`` tag of ``omni_ray_requests_total``)."""

    OK = "ok"
    ERROR = "error"          # a stage failed it (cause: the stage) or the ingress did (internal)
    ABORTED = "aborted"      # the client left or cancelled (cause: client_disconnect)
    REJECTED = "rejected"    # 503/429: a stage was full or unavailable (cause: overloaded)
    INVALID = "invalid"      # 4xx from the request's checks (cause: invalid_request)


def modality_tag(modalities) -> str:
    """``text``, ``audio`` or ``audio+text`` (sorted, so one spelling per set)."""
    return "+".join(sorted(set(modalities or ("text",))))


class IngressMetrics:
    """Request-level metrics, created once per ingress replica."""

    def __init__(self):
        from ray.serve.metrics import Counter, Histogram

        self.ttft = Histogram("omni_ray_time_to_first_token_seconds",
                              "Seconds from a request's arrival to its first text delta.",
                              boundaries=LATENCY_BUCKETS)
        self.ttfa = Histogram("omni_ray_time_to_first_audio_seconds",
                              "Seconds from a request's arrival to its first audio samples.",
                              boundaries=LATENCY_BUCKETS)
        self.requests = Counter("omni_ray_requests_total",
                                "Chat completion requests by how they ended and modality.",
                                tag_keys=("status", "modality"))
        self.aborts = Counter("omni_ray_request_aborts_total",
                              "Requests aborted before they finished, by cause.",
                              tag_keys=("cause",))
        self.errors = Counter("omni_ray_request_errors_total",
                              "Requests that failed or were refused, by cause.",
                              tag_keys=("cause",))

    def track(self, modalities) -> "RequestTrack":
        return RequestTrack(self, modality_tag(modalities))


class RequestTrack:
    """One request's timings and final status (``finish`` counts once; later calls are no-ops)."""

    def __init__(self, metrics: IngressMetrics, modality: str):
        self.metrics, self.modality = metrics, modality
        self.t0 = time.monotonic()
        self.ttft: float | None = None
        self.ttfa: float | None = None
        self.status: RequestStatus | None = None

    def on_text(self) -> None:
        if self.ttft is None:
            self.ttft = time.monotonic() - self.t0
            self.metrics.ttft.observe(self.ttft)

    def on_audio(self) -> None:
        if self.ttfa is None:
            self.ttfa = time.monotonic() - self.t0
            self.metrics.ttfa.observe(self.ttfa)

    def finish(self, status: RequestStatus, cause: str | None = None) -> None:
        if self.status is not None:
            return
        self.status = status
        m = self.metrics
        m.requests.inc(tags={"status": status.value, "modality": self.modality})
        if status == RequestStatus.ABORTED:
            m.aborts.inc(tags={"cause": cause or "unknown"})
        elif status != RequestStatus.OK:
            m.errors.inc(tags={"cause": cause or "unknown"})


class EngineMetrics:
    """Stage-level metrics of one engine actor (tagged ``stage``; chunk metrics ``edge``)."""

    def __init__(self, stage: str):
        from ray.util.metrics import Counter, Gauge, Histogram

        tags = {"stage": stage}
        self.queue_depth = Gauge("omni_ray_stage_queue_depth",
                                 "Requests admitted to the stage engine but not in its latest "
                                 "step (waiting for upstream chunks or a batch slot).",
                                 tag_keys=("stage",))
        self.running = Gauge("omni_ray_stage_running_requests",
                             "Requests advanced by the stage engine's latest step.",
                             tag_keys=("stage",))
        self.batch = Histogram("omni_ray_stage_batch_size",
                               "Requests advanced per step of the stage engine.",
                               boundaries=BATCH_BUCKETS, tag_keys=("stage",))
        for m in (self.queue_depth, self.running, self.batch):
            m.set_default_tags(tags)
        self.edge = EDGES.get(stage, f"{stage}->next")
        self._lock = threading.Lock()
        self._last = (-1, -1)
        self.chunk_latency = Histogram(
            "omni_ray_chunk_latency_seconds",
            "Seconds from a chunk's push by the sending engine to its acceptance by the "
            "receiving engine (the push's round trip).",
            boundaries=CHUNK_LATENCY_BUCKETS, tag_keys=("edge",))
        self.chunk_bytes = Counter("omni_ray_chunk_bytes_total",
                                   "Encoded chunk bytes pushed on an edge.", tag_keys=("edge",))
        self.chunks = Counter("omni_ray_chunks_total", "Chunks pushed on an edge.",
                              tag_keys=("edge",))
        for m in (self.chunk_latency, self.chunk_bytes, self.chunks):
            m.set_default_tags({"edge": self.edge})

    def on_step(self, batch: int, table: Sized) -> None:
        """After a step that advanced ``batch`` of the requests in ``table`` (the engine's
        request table; read under the lock, see ``on_requests``)."""
        self.batch.observe(batch)
        self._gauges(batch, table)

    def on_idle(self, table: Sized) -> None:
        """The loop is about to wait: nothing runs, every admitted request waits."""
        self._gauges(0, table)

    def on_requests(self, table: Sized) -> None:
        """The request table changed (a request ended or was dropped, on the actor's loop).
        The step loop goes idle before the table loses a finished request, so without this a
        stage with no request kept reading the depth of its last step."""
        self._gauges(None, table)

    def _gauges(self, running: int | None, table: Sized) -> None:
        # The step loop's thread and the actor's asyncio loop both get here; the table's size
        # is read under the lock, so the last writer always saw the newest table.
        with self._lock:
            requests = len(table)
            if running is None:  # keep the latest step's count, bounded by the table
                running = min(max(self._last[0], 0), requests)
            now = (running, max(requests - running, 0))
            if now == self._last:  # gauges only on change: the loop steps every few ms
                return
            self._last = now
            self.running.set(now[0])
            self.queue_depth.set(now[1])

    def on_chunk_acked(self, seconds: float, nbytes: int) -> None:
        self.chunk_latency.observe(seconds)
        self.chunk_bytes.inc(nbytes)
        self.chunks.inc()


class SupervisorMetrics:
    """A stage replica's engine failovers and its standby (stages/supervisor.py; tag ``stage``)."""

    def __init__(self, stage: str):
        from ray.util.metrics import Counter, Gauge

        self.failovers = Counter("omni_ray_engine_failovers_total",
                                 "Engines replaced after dying: `how` is `promoted` (the standby "
                                 "took over) or `restarted` (a new engine loaded).",
                                 tag_keys=("stage", "how"))
        self.standby = Gauge("omni_ray_engine_standby_ready",
                             "1 while the replica's standby engine is loaded, else 0 (only with "
                             "engine_restart.standby).", tag_keys=("stage",))
        self.failovers.set_default_tags({"stage": stage})
        self.standby.set_default_tags({"stage": stage})

    def on_failover(self, stage: str, how: str) -> None:
        self.failovers.inc(tags={"stage": stage, "how": how})

    def set_standby_ready(self, stage: str, ready: bool) -> None:
        self.standby.set(1.0 if ready else 0.0, tags={"stage": stage})
