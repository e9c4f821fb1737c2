"""Stage logic: one runner plus the routing of its output, Ray-free and synchronous.

A stage receives requests (``add``) and upstream chunks (``on_chunk``), advances its runner
(``step``) and returns ``Emit``s: chunks for the next stage (``down``) and items for the caller
(``out``: text deltas from the thinker, audio from code2wav). The engine actor drives it from
one thread; the offline pipeline could drive it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.payload import AudioChunk, CodecChunk, FinishReason, TextDelta, ThinkerChunk
from omni_ray.runners.chunking import CodecChunker, ThinkerChunker


class StageRequestError(Exception):
    """A request failed in a stage (the others go on)."""


@dataclass
class Emit:
    request_id: str
    target: str            # "down": to the next stage; "out": to the caller's stream
    item: Any              # a payload chunk (None for a bare end of stream)
    final: bool = False    # last item on this target for this request
    error: str | None = None


class StageLogic:
    """Common surface; subclasses own one runner."""

    stage: str = ""
    last_batch_size: int = 0  # requests advanced by the latest step (a metric)

    def add(self, req: OmniRequest, has_downstream: bool) -> None: ...
    def on_chunk(self, chunk) -> list[Emit]: return []
    def step(self) -> list[Emit]: return []
    def has_work(self) -> bool: return False
    def num_requests(self) -> int: return 0
    def _forget(self, rid: str) -> None: ...

    # Shared by every stage: fault injection, per-request errors, abort.
    def fail_next_step(self, request_id: str) -> None:
        """Tests only: the request fails at this stage's next step."""
        self._fail.add(request_id)

    def _fault(self, rid: str) -> Emit:
        return self._error_emit(rid, f"injected fault in {self.stage}")

    def _error_emit(self, rid: str, msg: str) -> Emit:
        self.runner.abort(rid)
        self._forget(rid)
        return Emit(rid, "out", None, True, error=msg)

    def abort(self, request_id: str) -> None:
        self.runner.abort(request_id)
        self._forget(request_id)


class ThinkerLogic(StageLogic):
    stage = "thinker"

    def __init__(self, runner, pipeline: PipelineConfig):
        self.runner = runner
        self.pipeline = pipeline
        self._chunkers: dict[str, ThinkerChunker | None] = {}
        self._seq: dict[str, int] = {}
        self._fail: set[str] = set()

    def add(self, req: OmniRequest, has_downstream: bool) -> None:
        if req.mm is not None:
            self.runner.add_request(req.request_id, req.prompt_token_ids, req.thinker_sampling,
                                    req.max_tokens, list(req.stop_token_ids), mm=req.mm)
        else:
            self.runner.add_request(req.request_id, req.prompt_token_ids, req.thinker_sampling,
                                    req.max_tokens, list(req.stop_token_ids))
        self._chunkers[req.request_id] = (
            ThinkerChunker(req.request_id, req.prompt_token_ids, self.pipeline.mode)
            if has_downstream else None)
        self._seq[req.request_id] = 0

    def has_work(self) -> bool:
        return self.runner.has_unfinished()

    def step(self) -> list[Emit]:
        emits = [self._fault(rid) for rid in list(self._fail)]
        outs = self.runner.step()
        self.last_batch_size = len(outs)
        for out in outs:
            rid = out.request_id
            seq = self._seq[rid]
            self._seq[rid] = seq + 1
            if out.error:
                emits.append(self._error_emit(rid, out.error))
                continue
            delta = TextDelta(request_id=rid, seq=seq, token_ids=out.new_token_ids,
                              finished=out.finished, finish_reason=out.finish_reason,
                              num_prompt_tokens=out.num_prompt_tokens)
            emits.append(Emit(rid, "out", delta, out.finished))
            chunker = self._chunkers[rid]
            if chunker is not None:
                if out.mm is not None:
                    chunker.set_mm(out.mm.hidden, out.mm.image_grid_thw,
                                   out.mm.audio_feature_lengths)
                for c in chunker.add(out.new_token_ids, out.finished, out.finish_reason):
                    emits.append(Emit(rid, "down", c, c.finished))
            if out.finished:
                self._forget(rid)
        return emits

    def _forget(self, rid: str) -> None:
        self._chunkers.pop(rid, None)
        self._seq.pop(rid, None)
        self._fail.discard(rid)

    def num_requests(self) -> int:
        return max(self.runner.num_requests, len(self._seq))


class TalkerLogic(StageLogic):
    stage = "talker"

    def __init__(self, runner, pipeline: PipelineConfig, num_code_groups: int):
        self.runner = runner
        self.pipeline = pipeline
        self.groups = num_code_groups
        self._chunkers: dict[str, CodecChunker] = {}
        self._fail: set[str] = set()

    def add(self, req: OmniRequest, has_downstream: bool) -> None:
        if not has_downstream:
            raise ValueError("talker needs a downstream code2wav stage")
        self.runner.add_request(req.request_id, req.speaker, req.talker_sampling,
                                req.max_audio_frames)
        p = self.pipeline
        self._chunkers[req.request_id] = CodecChunker(req.request_id, p.mode,
                                                      p.initial_chunk_frames, p.chunk_frames,
                                                      self.groups)

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

    def step(self) -> list[Emit]:
        emits = [self._fault(rid) for rid in list(self._fail)]
        outs = self.runner.step()
        self.last_batch_size = len(outs)
        for out in outs:
            rid = out.request_id
            if out.error:
                emits.append(self._error_emit(rid, out.error))
                continue
            for c in self._chunkers[rid].add(out.frames, out.finished, out.finish_reason):
                emits.append(Emit(rid, "down", c, c.finished))
            if out.finished:
                emits.append(Emit(rid, "out", None, True))
                self._forget(rid)
        return emits

    def _forget(self, rid: str) -> None:
        self._chunkers.pop(rid, None)
        self._fail.discard(rid)

    def num_requests(self) -> int:
        return max(self.runner.num_requests, len(self._chunkers))


class Code2WavLogic(StageLogic):
    stage = "code2wav"

    def __init__(self, runner, sample_rate: int = 24000):
        self.runner = runner
        self.sample_rate = sample_rate
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


def build_stage_logic(stage: str, model_dir: str, stage_cfg, pipeline: PipelineConfig,
                      max_model_len: int = 8192, kv_transfer: bool = False) -> StageLogic:
    """Load the stage's model and wrap its runner (runs inside the engine actor). On a GPU the
    load waits for its turn (stages/gpu_start.py: starts sharing a GPU never overlap)."""
    from omni_ray.stages.gpu_start import gpu_start_turn

    with gpu_start_turn(stage_cfg.device, stage):
        return _build_stage_logic(stage, model_dir, stage_cfg, pipeline, max_model_len,
                                  kv_transfer)


def _build_stage_logic(stage: str, model_dir: str, stage_cfg, pipeline: PipelineConfig,
                       max_model_len: int, kv_transfer: bool) -> StageLogic:
    import torch

    from omni_ray.models.loading import load_stage
    from omni_ray.runners.code2wav import Code2WavRunner
    from omni_ray.runners.factory import make_talker_runner, make_thinker_runner

    dtype = getattr(torch, stage_cfg.dtype)
    if stage == "thinker":
        engine_kwargs = None
        if stage_cfg.backend == "vllm":
            engine_kwargs = {"max_model_len": max_model_len, **stage_cfg.engine_kwargs}
        runner = make_thinker_runner(stage_cfg.backend, model_dir, stage_cfg.device, dtype,
                                     stage_cfg.max_num_seqs, engine_kwargs, kv_transfer)
        return ThinkerLogic(runner, pipeline)
    if stage == "talker":
        engine_kwargs = None
        if stage_cfg.backend == "vllm":
            engine_kwargs = {"max_model_len": max_model_len, **stage_cfg.engine_kwargs}
        runner = make_talker_runner(stage_cfg.backend, model_dir, stage_cfg.device, dtype,
                                    stage_cfg.max_num_seqs, engine_kwargs)
        return TalkerLogic(runner, pipeline, runner.num_code_groups)
    if stage == "code2wav":
        m = load_stage(model_dir, "code2wav", stage_cfg.device, dtype)
        runner = Code2WavRunner(m.module, mode=pipeline.code2wav_mode,
                                left_context_frames=pipeline.left_context_frames,
                                device=stage_cfg.device)
        return Code2WavLogic(runner)
    raise ValueError(f"unknown stage {stage!r}")
