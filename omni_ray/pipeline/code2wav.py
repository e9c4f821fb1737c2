"""Code2wav stage logic: ``CodecChunk``s in, ``AudioChunk``s to the caller.

Pending chunks are decoded most urgent first. Requests' first chunks go first: when any is
pending, a step takes only those (``first_chunks_first``), so a new request's first audio does
not wait behind the 25-frame chunks of every request already playing (they hold audio in
hand). Next come the chunks of requests whose audio sent so far plays out within ``urgent_s``
(by a player that starts at the first audio and waits whenever the next piece is late): a
stream's second chunk, with a frame of audio ahead of it, goes before the chunks of streams
with seconds in hand. Each request's chunks still decode in order, so the audio is the same.

The chosen chunks decode in rounds: round r holds each request's r-th pending chunk, at most
``max_batch`` requests, and is one batched forward (``decode_many``; in stateful mode the same
math as decoding each alone, up to float rounding: ``PipelineConfig.code2wav_batch`` keeps
float32 at one request a forward). Under load that is one forward for all streams, not one each.
A step runs one forward and sends its audio at once; the priorities are weighed again for the
next.
"""

from __future__ import annotations

import time

from omni_ray.config.request import OmniRequest
from omni_ray.payload import AudioChunk, CodecChunk, FinishReason
from omni_ray.pipeline.contracts import Code2WavRunnerProtocol
from omni_ray.pipeline.emit import Emit, StageLogic

SAMPLE_RATE = 24000  # Qwen3-Omni's code2wav output rate


class Code2WavLogic(StageLogic):
    stage = "code2wav"

    def __init__(self, runner: Code2WavRunnerProtocol, sample_rate: int = SAMPLE_RATE,
                 first_chunks_first: bool = True, max_batch: int = 1, urgent_s: float = 0.0,
                 clock=time.monotonic):
        """``urgent_s`` (with ``first_chunks_first``): a request whose audio out plays out
        within this many seconds of now is served in a step before the others (0: only those
        already late)."""
        self.runner = runner
        self.sample_rate = sample_rate
        self.first_chunks_first = first_chunks_first
        self.max_batch = max_batch
        self.urgent_s, self.clock = urgent_s, clock
        self._pending: list[CodecChunk] = []
        self._seq: dict[str, int] = {}
        self._plays_out: dict[str, float] = {}  # when the audio sent so far has played
        self._fail: set[str] = set()

    def tune(self, pipeline) -> None:
        self.urgent_s = pipeline.code2wav_urgent_ms / 1000  # weighed again at the next step
        use = getattr(self.runner, "use_step_graphs", None)  # the transformers runner's
        if use is not None:
            use(pipeline.code2wav_step_graphs)  # from the next step

    def check(self, req: OmniRequest, has_downstream: bool) -> bool:
        return True  # any request id the engine took is fine here

    def add(self, req: OmniRequest, has_downstream: bool) -> None:
        self.runner.add_request(req.request_id)
        self._seq[req.request_id] = 0

    def on_chunk(self, chunk: CodecChunk) -> list[Emit]:
        if chunk.request_id not in self._seq:
            return []
        if chunk.finish_reason == FinishReason.ERROR:
            return [self._error_emit(chunk.request_id, "talker failed")]
        self._pending.append(chunk)
        return []

    def has_work(self) -> bool:
        return bool(self._pending) or bool(self._fail)

    def step(self) -> list[Emit]:
        emits = [self._fault(rid) for rid in list(self._fail)]
        pending, self._pending = self._pending, []
        if self.first_chunks_first:  # the most urgent requests' chunks, all of them, in order
            urgent = self._most_urgent({c.request_id for c in pending})
            if urgent and len(urgent) < len({c.request_id for c in pending}):
                self._pending = [c for c in pending if c.request_id not in urgent]
                pending = [c for c in pending if c.request_id in urgent]
        # One forward a step: its audio goes out now, and what arrived meanwhile (a new first
        # chunk, a stream running dry) is weighed before the next forward; the rest waits, in
        # order, ahead of what came later.
        batch, *later = _rounds(pending, self.max_batch) or [[]]
        self._pending = [c for b in later for c in b] + self._pending
        self.last_batch_size = len(batch)
        if batch:
            emits.extend(self._decode(batch))
        return emits

    def _most_urgent(self, rids: set[str]) -> set[str]:
        """Requests with no audio out yet (their first chunks decode as a batch of fresh
        states); else those whose audio plays out within ``urgent_s``; else none."""
        new = {r for r in rids if self._seq.get(r) == 0}
        if new:
            return new
        due = self.clock() + self.urgent_s
        return {r for r in rids if self._plays_out.get(r, due) < due}

    def _decode(self, batch: list[CodecChunk]) -> list[Emit]:
        try:
            pieces = self.runner.decode_many([(c.request_id, c.codes) for c in batch])
        except Exception as e:  # the runner could not tell them apart: the requests of this call
            pieces = [e] * len(batch)
        emits = []
        for chunk, piece in zip(batch, pieces):
            rid = chunk.request_id
            if isinstance(piece, Exception):  # this request only
                emits.append(self._error_emit(rid, f"{type(piece).__name__}: {piece}"))
                continue
            start, samples = piece
            seq = self._seq[rid]
            self._seq[rid] = seq + 1
            now = self.clock()
            self._plays_out[rid] = (max(self._plays_out.get(rid, now), now)
                                    + samples.numel() / self.sample_rate)
            audio = AudioChunk(request_id=rid, seq=seq, start_sample=start, samples=samples,
                               sample_rate=self.sample_rate, finished=chunk.finished,
                               finish_reason=chunk.finish_reason)
            emits.append(Emit(rid, "out", audio, chunk.finished))
            if chunk.finished:
                self.runner.finish(rid)
                self._forget(rid)
        return emits

    def _forget(self, rid: str) -> None:
        self._seq.pop(rid, None)
        self._plays_out.pop(rid, None)
        self._fail.discard(rid)
        self._pending = [c for c in self._pending if c.request_id != rid]

    def num_requests(self) -> int:
        return max(self.runner.num_requests, len(self._seq))

    def request_ids(self) -> list[str]:
        return sorted(set(self._seq) | self._fail | {c.request_id for c in self._pending})


def _rounds(chunks: list[CodecChunk], max_batch: int) -> list[list[CodecChunk]]:
    """Round r: each request's r-th chunk (arrival order kept), split into ``max_batch``-sized
    forwards; every chunk of a request lands in a later round than its predecessors."""
    rounds: list[list[CodecChunk]] = []
    seen: dict[str, int] = {}
    for c in chunks:
        r = seen.get(c.request_id, 0)
        seen[c.request_id] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(c)
    return [rnd[i:i + max_batch] for rnd in rounds for i in range(0, len(rnd), max_batch)]
