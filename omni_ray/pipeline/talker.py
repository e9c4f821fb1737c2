"""Talker stage logic: thinker text in, ``CodecChunk``s (initial, then fixed-size) to code2wav."""

from __future__ import annotations

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.payload import FinishReason, ThinkerChunk
from omni_ray.pipeline.chunking import CodecChunker
from omni_ray.pipeline.contracts import TalkerRunnerProtocol
from omni_ray.pipeline.emit import Emit, StageLogic


class TalkerLogic(StageLogic):
    stage = "talker"

    def __init__(self, runner: TalkerRunnerProtocol, pipeline: PipelineConfig,
                 num_code_groups: int):
        self.runner = runner
        self.pipeline = pipeline
        self.groups = num_code_groups
        self._chunkers: dict[str, CodecChunker] = {}
        self._fail: set[str] = set()
        self.first_chunks_held = 0  # (hold_first_chunk_above)

    def tune(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline  # hold_first_chunk_above: from the next first chunk on

    def counters(self) -> dict[str, int]:
        return {"first_chunks_held": self.first_chunks_held}

    def check(self, req: OmniRequest, has_downstream: bool) -> bool:
        if not has_downstream:
            raise ValueError("talker needs a downstream code2wav stage")
        self.runner.check_request(req.speaker, req.max_audio_frames)
        return True

    def add(self, req: OmniRequest, has_downstream: bool) -> None:
        self.check(req, has_downstream)
        self.runner.add_request(req.request_id, req.speaker, req.talker_sampling,
                                req.max_audio_frames)
        p = self.pipeline
        self._chunkers[req.request_id] = CodecChunker(req.request_id, p.mode,
                                                      p.initial_chunk_frames, p.chunk_frames,
                                                      self.groups, p.ramp_chunks,
                                                      p.ramp_ratio)

    def on_chunk(self, chunk: ThinkerChunk) -> list[Emit]:
        if chunk.request_id not in self._chunkers:
            return []  # finished or aborted here already: late text is dropped on purpose
        if chunk.finish_reason == FinishReason.ERROR:
            return [self._error_emit(chunk.request_id, "thinker failed")]
        self.runner.push_text(chunk.request_id, chunk.token_ids, chunk.finished,
                              chunk.prompt_token_ids, chunk.mm_hidden, chunk.image_grid_thw,
                              chunk.audio_feature_lengths)
        return []

    def has_work(self) -> bool:
        return bool(self._fail) or self.runner.has_ready()

    def _on_output(self, out) -> list[Emit]:
        rid = out.request_id
        chunker = self._chunkers[rid]
        if chunker.seq == 0:  # its first chunk may be made now: under load?
            above = self.pipeline.hold_first_chunk_above
            chunker.hold_first = 0 < above < len(self._chunkers)
        was_held = chunker.held is not None
        chunks = chunker.add(out.frames, out.finished, out.finish_reason)
        self.first_chunks_held += chunker.held is not None and not was_held
        emits = [Emit(rid, "down", c, c.finished) for c in chunks]
        if out.finished:
            emits.append(Emit(rid, "out", None, True))
            self._forget(rid)
        return emits

    def _forget(self, rid: str) -> None:
        self._chunkers.pop(rid, None)
        self._fail.discard(rid)

    def num_requests(self) -> int:
        return max(self.runner.num_requests, len(self._chunkers))

    def request_ids(self) -> list[str]:
        return sorted(set(self._chunkers) | self._fail)
