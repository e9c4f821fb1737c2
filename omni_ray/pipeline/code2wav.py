"""Code2wav stage logic: ``CodecChunk``s in, ``AudioChunk``s to the caller.

A step decodes every pending chunk, except that requests' first chunks go first: when any is
pending, the step decodes only those (``first_chunks_first``), so a new request's first audio
does not wait behind the 25-frame chunks of every request already playing (they hold audio in
hand). Each request's chunks still decode in order, so the audio is the same.
"""

from __future__ import annotations

from omni_ray.config.request import OmniRequest
from omni_ray.payload import AudioChunk, CodecChunk, FinishReason
from omni_ray.pipeline.contracts import Code2WavRunnerProtocol
from omni_ray.pipeline.emit import Emit, StageLogic

SAMPLE_RATE = 24000  # Qwen3-Omni's code2wav output rate


class Code2WavLogic(StageLogic):
    stage = "code2wav"

    def __init__(self, runner: Code2WavRunnerProtocol, sample_rate: int = SAMPLE_RATE,
                 first_chunks_first: bool = True):
        self.runner = runner
        self.sample_rate = sample_rate
        self.first_chunks_first = first_chunks_first
        self._pending: list[CodecChunk] = []
        self._seq: dict[str, int] = {}
        self._fail: set[str] = set()

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
        if self.first_chunks_first:  # requests with no audio out yet: all their chunks, in order
            new = [c for c in pending if self._seq.get(c.request_id) == 0]
            if new and len(new) < len(pending):
                self._pending = [c for c in pending if self._seq.get(c.request_id) != 0]
                pending = new
        self.last_batch_size = len({c.request_id for c in pending})
        for chunk in pending:
            rid = chunk.request_id
            if rid not in self._seq:
                continue
            try:
                start, samples = self.runner.decode(rid, chunk.codes)
            except Exception as e:  # this request only
                emits.append(self._error_emit(rid, f"{type(e).__name__}: {e}"))
                continue
            seq = self._seq[rid]
            self._seq[rid] = seq + 1
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
        self._fail.discard(rid)
        self._pending = [c for c in self._pending if c.request_id != rid]

    def num_requests(self) -> int:
        return max(self.runner.num_requests, len(self._seq))

    def request_ids(self) -> list[str]:
        return sorted(set(self._seq) | self._fail | {c.request_id for c in self._pending})
