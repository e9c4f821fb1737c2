"""Thinker stage logic: text deltas to the caller, ``ThinkerChunk``s to the talker."""

from __future__ import annotations

from dataclasses import dataclass

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.payload import FinishReason, TextDelta
from omni_ray.pipeline.chunking import ThinkerChunker
from omni_ray.pipeline.contracts import ThinkerRunnerProtocol
from omni_ray.pipeline.emit import Emit, StageLogic


@dataclass
class _GivenAnswer:
    """A request's answer given, not generated (``OmniRequest.answer_token_ids``), in the shape
    of a runner's step output: routed exactly like one."""

    request_id: str
    new_token_ids: list[int]
    num_prompt_tokens: int
    finished: bool = True
    finish_reason: FinishReason = FinishReason.STOP
    mm: None = None


class ThinkerLogic(StageLogic):
    stage = "thinker"

    def __init__(self, runner: ThinkerRunnerProtocol, pipeline: PipelineConfig):
        self.runner = runner
        self.pipeline = pipeline
        self._chunkers: dict[str, ThinkerChunker | None] = {}
        self._seq: dict[str, int] = {}
        self._fail: set[str] = set()
        self._given: dict[str, _GivenAnswer] = {}  # answers given: emitted at the next step

    def tune(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline  # text_chunk_ms: for the requests added from now on

    def add(self, req: OmniRequest, has_downstream: bool) -> None:
        if req.answer_token_ids is not None:  # text to speech: no model step
            self._given[req.request_id] = _GivenAnswer(
                req.request_id, list(req.answer_token_ids), len(req.prompt_token_ids))
        elif req.mm is not None:
            self.runner.add_request(req.request_id, req.prompt_token_ids, req.thinker_sampling,
                                    req.max_tokens, list(req.stop_token_ids), mm=req.mm)
        else:
            self.runner.add_request(req.request_id, req.prompt_token_ids, req.thinker_sampling,
                                    req.max_tokens, list(req.stop_token_ids))
        self._track(req, has_downstream)

    def _track(self, req: OmniRequest, has_downstream: bool) -> None:
        """Start the request's bookkeeping here (its runner already holds it)."""
        self._chunkers[req.request_id] = (
            ThinkerChunker(req.request_id, req.prompt_token_ids, self.pipeline.mode,
                           interval_s=self.pipeline.text_chunk_ms / 1e3)
            if has_downstream else None)
        self._seq[req.request_id] = 0

    def has_work(self) -> bool:
        return bool(self._given) or self.runner.has_unfinished()

    def step(self) -> list[Emit]:
        given, self._given = list(self._given.values()), {}
        emits = [e for g in given for e in self._on_output(g)]
        if not self.runner.has_unfinished() and not self._fail:
            self.last_batch_size = len(given)
            return emits
        emits += super().step()
        self.last_batch_size += len(given)
        return emits

    def _on_output(self, out) -> list[Emit]:
        rid = out.request_id
        seq = self._seq[rid]
        self._seq[rid] = seq + 1
        delta = TextDelta(request_id=rid, seq=seq, token_ids=out.new_token_ids,
                          finished=out.finished, finish_reason=out.finish_reason,
                          num_prompt_tokens=out.num_prompt_tokens)
        emits = [Emit(rid, "out", delta, out.finished)]
        chunker = self._chunkers[rid]
        if chunker is not None:
            if out.mm is not None:
                chunker.set_mm(out.mm.hidden, out.mm.image_grid_thw, out.mm.audio_feature_lengths)
            for c in chunker.add(out.new_token_ids, out.finished, out.finish_reason):
                emits.append(Emit(rid, "down", c, c.finished))
        if out.finished:
            self._forget(rid)
        return emits

    def _forget(self, rid: str) -> None:
        self._given.pop(rid, None)
        self._chunkers.pop(rid, None)
        self._seq.pop(rid, None)
        self._fail.discard(rid)

    def num_requests(self) -> int:
        return max(self.runner.num_requests, len(self._seq))

    def request_ids(self) -> list[str]:
        return sorted(set(self._seq) | set(self._chunkers) | self._fail)
