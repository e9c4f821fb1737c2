"""Offline pipeline: the three stages in one process, driven step by step.

``Omni(model=DIR, mode="sync"|"async_chunk").generate(requests)`` runs thinker, talker and
code2wav with the same runners and the same stage logic as the Serve app: ``Omni`` builds the
runners and hands them to the local driver (``pipeline/local.py``), which steps the stage logics
and routes their chunks through the wire codec (``transport.local``). In sync mode each stage sees
a request only once the previous stage finished it; in async_chunk the talker starts on the
thinker's first tokens and code2wav decodes codec chunks as they arrive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.inputs.processor import InputProcessor
from omni_ray.models.loading import load_omni_config
from omni_ray.models.tokenizer import encode_chat, load_tokenizer
from omni_ray.payload import FinishReason
from omni_ray.pipeline.build import wrap_runner
from omni_ray.pipeline.code2wav import SAMPLE_RATE
from omni_ray.pipeline.local import LocalPipeline, LocalResult
from omni_ray.runners.factory import make_runner, stage_config


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
        common = dict(device=device, dtype=dtype, max_num_seqs=max_num_seqs)
        self.thinker = thinker_runner
        if thinker_runner is None:
            cfg = stage_config("thinker", thinker_backend, engine_kwargs=thinker_engine_kwargs,
                               **common)
            self.thinker = make_runner("thinker", model, cfg, pipeline=self.pipeline)
        self.talker = self.code2wav = None
        if audio:
            cfg = stage_config("talker", talker_backend, engine_kwargs=talker_engine_kwargs,
                               **common)
            self.talker = make_runner("talker", model, cfg, pipeline=self.pipeline)
            self.code2wav = make_runner("code2wav", model, stage_config("code2wav", **common),
                                        pipeline=self.pipeline)
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

    def speech_request(self, text: str, request_id: str = "speech", **fields) -> OmniRequest:
        """Text to speech: an ``OmniRequest`` whose answer is ``text`` itself (the thinker does not
        generate; models/tokenizer.py ``speech_ids``), as ``/v1/audio/speech`` builds it."""
        from omni_ray.models.tokenizer import speech_ids

        prompt, answer = speech_ids(self.tokenizer, text)
        return OmniRequest(request_id=request_id, prompt_token_ids=prompt,
                           answer_token_ids=answer, **fields)

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
        return [self._output(res) for res in self.local_pipeline().run(reqs)]

    def local_pipeline(self) -> LocalPipeline:
        """A local driver over this ``Omni``'s runners, as ``pipeline`` says now (tests and
        benchmarks replace ``pipeline`` or a runner between calls)."""
        runners = [("thinker", self.thinker), ("talker", self.talker), ("code2wav", self.code2wav)]
        return LocalPipeline([wrap_runner(stage, runner, self.pipeline)
                              for stage, runner in runners if runner is not None])

    def _output(self, res: LocalResult) -> OmniOutput:
        frames = (torch.cat(res.codes) if res.codes
                  else torch.empty((0, self.groups), dtype=torch.long))
        audio = torch.cat(res.audio) if res.audio else torch.empty(0)
        return OmniOutput(
            request_id=res.request.request_id,
            text=self.tokenizer.decode(res.text_ids, skip_special_tokens=True),
            text_token_ids=res.text_ids, finish_reason=res.finish_reason, codec_frames=frames,
            audio=audio, audio_pieces=[p.numel() for p in res.audio],
            time_to_first_token=res.ttft, time_to_first_audio=res.ttfa,
            latency=time.perf_counter() - res.t0, error=res.error,
        )
