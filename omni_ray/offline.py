"""Offline pipeline: the three stages in one process, driven step by step.

``Omni(model=DIR, mode="sync"|"async_chunk").generate(requests)`` runs thinker, talker and
code2wav with the same runners and chunking as the Serve app; chunks cross stages through the wire
codec (``transport.local``). In sync mode each stage sees a request only once the previous stage
finished it; in async_chunk the talker starts on the thinker's first tokens and code2wav decodes
codec chunks as they arrive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.inputs.processor import InputProcessor
from omni_ray.models.loading import load_omni_config, load_stage
from omni_ray.models.tokenizer import encode_chat, load_tokenizer
from omni_ray.payload import FinishReason
from omni_ray.runners.chunking import CodecChunker, ThinkerChunker
from omni_ray.runners.code2wav import Code2WavRunner
from omni_ray.runners.factory import make_talker_runner, make_thinker_runner
from omni_ray.transport.local import send_local

SAMPLE_RATE = 24000


@dataclass
class OmniOutput:
    """One finished request."""

    request_id: str
    text: str
    text_token_ids: list[int]
    finish_reason: FinishReason
    codec_frames: torch.Tensor                      # [frames, 16] int64
    audio: torch.Tensor                             # [samples] float32 at sample_rate
    audio_pieces: list[int] = field(default_factory=list)  # sample count of each emitted piece
    sample_rate: int = SAMPLE_RATE
    time_to_first_token: float | None = None
    time_to_first_audio: float | None = None
    latency: float | None = None
    error: str | None = None  # why a stage failed this request ("talker: ..."), else None

    def summary(self) -> dict:
        return dict(
            request_id=self.request_id, text=self.text, text_token_ids=self.text_token_ids,
            finish_reason=self.finish_reason.name.lower(), codec_frames=int(self.codec_frames.shape[0]),
            audio_samples=int(self.audio.numel()), sample_rate=self.sample_rate,
            audio_seconds=self.audio.numel() / self.sample_rate,
            time_to_first_token=self.time_to_first_token, time_to_first_audio=self.time_to_first_audio,
            latency=self.latency, error=self.error,
        )


@dataclass
class _Track:
    """Per-request bookkeeping in the driver."""

    req: OmniRequest
    t0: float
    thinker_chunker: ThinkerChunker
    codec_chunker: CodecChunker | None
    text_ids: list[int] = field(default_factory=list)
    reason: FinishReason = FinishReason.NONE
    frames: list[torch.Tensor] = field(default_factory=list)
    audio: list[torch.Tensor] = field(default_factory=list)
    text_done: bool = False
    talker_done: bool = False
    audio_done: bool = False
    ttft: float | None = None
    ttfa: float | None = None
    error: str | None = None


class Omni:
    """The offline pipeline over a local Qwen3-Omni checkpoint."""

    def __init__(self, model: str | Path, mode: str = "async_chunk", *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, pipeline: PipelineConfig | None = None,
                 max_num_seqs: int = 64, thinker_backend: str = "transformers",
                 thinker_engine_kwargs: dict | None = None, thinker_runner=None,
                 talker_backend: str = "transformers", talker_engine_kwargs: dict | None = None,
                 audio: bool = True):
        """``thinker_backend`` / ``talker_backend``: "transformers" or "vllm" (the
        ``*_engine_kwargs`` go to vLLM's EngineArgs). ``thinker_runner`` injects a ready thinker runner (e.g. one vLLM engine
        shared by tests) instead of building one; it must be idle and is not owned by ``Omni``.
        ``audio=False`` loads the thinker alone (no talker, no code2wav): text-only requests."""
        self.model_dir = Path(model)
        self.pipeline = (pipeline or PipelineConfig()).model_copy(update={"mode": mode})
        self._injected_thinker = thinker_runner
        self.thinker = (thinker_runner if thinker_runner is not None else make_thinker_runner(
            thinker_backend, model, device, dtype, max_num_seqs, thinker_engine_kwargs))
        self.talker = self.code2wav = None
        if audio:
            self.talker = make_talker_runner(talker_backend, model, device, dtype, max_num_seqs,
                                             talker_engine_kwargs)
            cw = load_stage(model, "code2wav", device, dtype)
            self.code2wav = Code2WavRunner(cw.module, mode=self.pipeline.code2wav_mode,
                                           left_context_frames=self.pipeline.left_context_frames,
                                           device=device)
        cfg = self.talker.cfg if audio else load_omni_config(model)
        self.config = cfg
        self.tokenizer = load_tokenizer(model)
        self.inputs = InputProcessor(model, self.tokenizer)
        self.groups = cfg.talker_config.num_code_groups

    def prompt_ids(self, text: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else [])
        return encode_chat(self.tokenizer, messages + [{"role": "user", "content": text}])

    def request(self, messages: list[dict], request_id: str = "offline", **fields) -> OmniRequest:
        """An ``OmniRequest`` for chat ``messages`` whose content may hold audio and image parts
        (``{"type": "audio", "audio": float32 16 kHz numpy}``, ``{"type": "image", "image": PIL
        image}``, see ``omni_ray.inputs``); ``fields`` set the rest (speaker, max_tokens, ...)."""
        ids, mm = self.inputs.build(messages, raw_media=getattr(self.thinker, "needs_raw_media", False))
        return OmniRequest(request_id=request_id, prompt_token_ids=ids, mm=mm, **fields)

    def shutdown(self) -> None:
        """Stop the vLLM engines (if any) together: in-process vLLM engines share the process's
        parallel state, which the first engine shutdown tears down for all of them."""
        for runner in (self.talker, self.thinker):
            if runner is not None and hasattr(runner, "shutdown") and runner is not self._injected_thinker:
                runner.shutdown()

    def generate(self, requests: OmniRequest | list[OmniRequest]) -> list[OmniOutput]:
        """Run requests together (continuous batching); returns outputs in request order."""
        reqs = [requests] if isinstance(requests, OmniRequest) else list(requests)
        if self.talker is None and any(r.wants_audio for r in reqs):
            raise ValueError("this Omni was built with audio=False (no talker, no code2wav): "
                             "ask for modalities=('text',)")
        ids = [r.request_id for r in reqs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate request ids in one generate() call: {ids}")
        tracks: dict[str, _Track] = {}
        now = time.perf_counter()
        try:
            # A request a runner rejects (unknown speaker, ...) must not leave the others, or its
            # own half-registered state, behind in the runners: the except clause clears them all.
            for r in reqs:
                tracks[r.request_id] = self._add(r, now)
            while not all(t.text_done and t.audio_done for t in tracks.values()):
                progressed = self._thinker_step(tracks)
                progressed |= self._talker_step(tracks)
                if not progressed:
                    raise RuntimeError("pipeline stalled: no stage can make progress")
        except BaseException:
            for rid in ids:
                for runner in (self.thinker, self.talker, self.code2wav):
                    if runner is not None:
                        runner.abort(rid)
            raise
        return [self._output(tracks[r.request_id]) for r in reqs]

    def _add(self, r: OmniRequest, now: float) -> _Track:
        """Register ``r`` with every stage it needs; returns its driver-side track."""
        p = self.pipeline
        mm = {"mm": r.mm} if r.mm is not None else {}
        self.thinker.add_request(r.request_id, r.prompt_token_ids, r.thinker_sampling,
                                 r.max_tokens, list(r.stop_token_ids), **mm)
        chunker = None
        if r.wants_audio:
            self.talker.add_request(r.request_id, r.speaker, r.talker_sampling,
                                    r.max_audio_frames)
            self.code2wav.add_request(r.request_id)
            chunker = CodecChunker(r.request_id, p.mode, p.initial_chunk_frames, p.chunk_frames,
                                   self.groups)
        return _Track(r, now, ThinkerChunker(r.request_id, r.prompt_token_ids, p.mode), chunker,
                      audio_done=not r.wants_audio)

    # 1) Thinker: one token per running request; text to the caller, chunks to the talker.
    def _thinker_step(self, tracks: dict[str, _Track]) -> bool:
        if not self.thinker.has_unfinished():
            return False
        for out in self.thinker.step():
            t = tracks[out.request_id]
            if t.ttft is None:
                t.ttft = time.perf_counter() - t.t0
            t.text_ids.extend(out.new_token_ids)
            if out.finished:
                t.text_done, t.reason = True, out.finish_reason
            if getattr(out, "error", None):
                t.error = t.error or f"thinker: {out.error}"
            if not t.req.wants_audio or t.talker_done:
                continue  # text only, or the talker already finished (e.g. max_audio_frames)
            if out.mm is not None:
                t.thinker_chunker.set_mm(out.mm.hidden, out.mm.image_grid_thw,
                                         out.mm.audio_feature_lengths)
            for chunk in t.thinker_chunker.add(out.new_token_ids, out.finished, out.finish_reason):
                c = send_local(chunk)
                self.talker.push_text(c.request_id, c.token_ids, c.finished, c.prompt_token_ids,
                                      c.mm_hidden, c.image_grid_thw, c.audio_feature_lengths)
        return True

    # 2) Talker: one frame per ready request; codec chunks to code2wav, decoded on arrival.
    def _talker_step(self, tracks: dict[str, _Track]) -> bool:
        if self.talker is None or not self.talker.has_ready():
            return False
        for out in self.talker.step():
            t = tracks[out.request_id]
            t.talker_done = t.talker_done or out.finished
            if out.error:
                t.error = t.error or f"talker: {out.error}"
            for chunk in t.codec_chunker.add(out.frames, out.finished, out.finish_reason):
                self._vocode(t, send_local(chunk))
        return True

    # 3) Code2wav: a chunk in, a waveform piece out.
    def _vocode(self, t: _Track, chunk) -> None:
        t.frames.append(chunk.codes)
        _, piece = self.code2wav.decode(chunk.request_id, chunk.codes)
        if piece.numel() and t.ttfa is None:
            t.ttfa = time.perf_counter() - t.t0
        t.audio.append(piece)
        if chunk.finished:
            self.code2wav.finish(chunk.request_id)
            t.audio_done = True

    def _output(self, t: _Track) -> OmniOutput:
        frames = (torch.cat(t.frames) if t.frames
                  else torch.empty((0, self.groups), dtype=torch.long))
        audio = torch.cat(t.audio) if t.audio else torch.empty(0)
        return OmniOutput(
            request_id=t.req.request_id,
            text=self.tokenizer.decode(t.text_ids, skip_special_tokens=True),
            text_token_ids=t.text_ids, finish_reason=t.reason, codec_frames=frames, audio=audio,
            audio_pieces=[p.numel() for p in t.audio], time_to_first_token=t.ttft,
            time_to_first_audio=t.ttfa, latency=time.perf_counter() - t.t0, error=t.error,
        )
