"""Code2wav runner: codec frames in, waveform pieces out, per request, joined exactly.

Two decode modes:

* ``window``: re-decode ``left_context_frames`` earlier frames with every chunk and keep only the
  new samples. The piece for frames [s, e) is ``w[ctx*spf - tail:]`` of ``decode(codes[s-ctx:e])``
  where ``tail = (e-s+ctx)*spf - len(w)`` (the samples that need the next frame); pieces join with
  no sample lost or doubled. Equal to a one-shot decode when the context covers the vocoder's
  receptive field.
* ``stateful``: carry attention and convolution state between chunks and decode only the new
  frames (see ``code2wav_stream``): equal to a one-shot decode for any chunking.

After N frames a request has produced exactly N*spf - tail samples in both modes, as many as a
one-shot decode of those N frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from omni_ray.runners.start_phases import StartPhases

if TYPE_CHECKING:
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.serving import StageConfig


@dataclass
class _Req:
    request_id: str
    frames: list[torch.Tensor] = field(default_factory=list)  # [n, 16] int64 pieces (window mode)
    num_frames: int = 0
    samples_out: int = 0
    stream_state: object = None                                # stateful mode


class Code2WavRunner:
    """Owns the code2wav module; ``decode`` is called per arriving codec chunk."""

    def __init__(self, code2wav, *, mode: str, left_context_frames: int = 25,
                 device: str = "cpu", first_chunk_frames: int | None = None,
                 pad_shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                 step_graphs: bool = False):
        """``first_chunk_frames`` (the pipeline's first chunk; None: no graphs): on CUDA a
        stateful first call of that many frames replays a CUDA graph (code2wav_graph.py).
        ``pad_shapes`` (batch sizes, frame counts; ``PipelineConfig.code2wav_shapes``): stateful
        eager forwards padded up to them, each run once by ``warm_up`` (code2wav_shapes.py).
        ``step_graphs`` (with ``pad_shapes``, on CUDA): those forwards replay CUDA graphs where
        no row is a request's first call, captured by ``warm_up`` (code2wav_step_graphs.py)."""
        # no default mode here: ``PipelineConfig`` decides it for the app, Omni and the CLI
        if mode not in ("window", "stateful"):
            raise ValueError(f"code2wav mode must be 'window' or 'stateful', got {mode!r}")
        if left_context_frames < 1:
            raise ValueError("left_context_frames must be >= 1")
        self.model = code2wav
        self.mode = mode
        self.ctx = left_context_frames
        self.device = device
        self.samples_per_frame = int(code2wav.total_upsample)
        # "float32", "bfloat16", ...: the batching default follows it (PipelineConfig.code2wav_batch)
        self.dtype = str(next(code2wav.parameters()).dtype).removeprefix("torch.")
        self._reqs: dict[str, _Req] = {}
        self._stream = None
        self.start_phases = StartPhases()
        if mode == "stateful":
            from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav

            self._stream = StreamingCode2Wav(code2wav)
            if first_chunk_frames and str(device).startswith("cuda"):
                from omni_ray.runners.transformers.code2wav_graph import FirstCallGraphs

                with self.start_phases.timed("first_call_graphs_s"):
                    self._stream.first_graphs = FirstCallGraphs(self._stream, first_chunk_frames)
                    self._stream.first_graphs.warm_up()
            if pad_shapes:
                from omni_ray.runners.transformers.code2wav_shapes import ShapeBuckets

                self._stream.buckets = ShapeBuckets(self._stream, *pad_shapes)
                if step_graphs and str(device).startswith("cuda"):
                    from omni_ray.runners.transformers.code2wav_step_graphs import StepGraphs

                    self._stream.step_graphs = StepGraphs(self._stream, *pad_shapes)

    def warm_up(self) -> None:
        """Run each shape the eager forwards are padded to once (none where not padded), and
        capture their CUDA graphs (where on), after the engine's GPU start turn
        (runners/factory.py)."""
        buckets = self._stream.buckets if self._stream is not None else None
        if buckets is not None and not buckets.warmed:
            with self.start_phases.timed("shape_warmup_s"):
                buckets.warm_up()
        steps = self._stream.step_graphs if self._stream is not None else None
        if steps is not None and not steps.ready:
            with self.start_phases.timed("step_graphs_s"):
                steps.warm_up()

    def use_step_graphs(self, on: bool) -> None:
        """Replay the step graphs captured at start (``code2wav_step_graphs``, live), or run
        those steps eager; nothing where none were captured."""
        steps = self._stream.step_graphs if self._stream is not None else None
        if steps is not None:
            steps.enabled = on

    @classmethod
    def from_config(cls, model_dir: str | Path, stage_cfg: StageConfig, *,
                    pipeline: PipelineConfig, kv_transfer: bool = False,
                    max_model_len: int | None = None) -> Code2WavRunner:
        """Load the checkpoint's code2wav as ``stage_cfg`` says (device, dtype), decoding as
        ``pipeline`` says (``code2wav_mode``, ``left_context_frames``)."""
        from omni_ray.models.loading import load_stage

        m = load_stage(model_dir, "code2wav", stage_cfg.device, getattr(torch, stage_cfg.dtype))
        return cls(m.module, mode=pipeline.code2wav_mode,
                   left_context_frames=pipeline.left_context_frames, device=stage_cfg.device,
                   first_chunk_frames=pipeline.initial_chunk_frames,
                   pad_shapes=pipeline.code2wav_shapes(stage_cfg.dtype),
                   step_graphs=pipeline.code2wav_step_graphs)

    @property
    def time_spent(self) -> dict:
        """Counters for the engine's stats (``/debug/stats``) and its step records: first calls
        replayed as CUDA graphs, the graph buckets captured and checked at start (0 where none),
        the padded (batch, frames) pairs captured as graphs and the steps that replayed them,
        and the stateful decoder's eager forwards, and how many of them had a (batch, frames)
        not run before (on CUDA those build their convolutions' kernels first)."""
        stream = self._stream
        graphs = stream.first_graphs if stream is not None else None
        buckets = stream.buckets if stream is not None else None
        steps = stream.step_graphs if stream is not None else None
        return dict(graph_first_calls=graphs.calls if graphs else 0,
                    graph_buckets=graphs.ready if graphs else 0,
                    shapes_warmed=buckets.warmed if buckets else 0,
                    step_graphs=steps.ready if steps else 0,
                    graph_steps=steps.calls if steps else 0,
                    forwards=stream.forwards if stream is not None else 0,
                    new_shapes=stream.new_shapes if stream is not None else 0)

    def add_request(self, request_id: str) -> None:
        if request_id in self._reqs:
            raise ValueError(f"duplicate request_id {request_id!r}")
        req = _Req(request_id)
        if self._stream is not None:
            req.stream_state = self._stream.new_state()
        self._reqs[request_id] = req

    def abort(self, request_id: str) -> bool:
        return self._reqs.pop(request_id, None) is not None

    def finish(self, request_id: str) -> None:
        self._reqs.pop(request_id, None)

    @property
    def num_requests(self) -> int:
        return len(self._reqs)

    def request_ids(self) -> list[str]:
        return list(self._reqs)

    @torch.inference_mode()
    def decode(self, request_id: str, codes: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Decode new frames ``codes`` [n, 16]; returns (start_sample, new float32 samples)."""
        req = self._reqs[request_id]
        start = req.samples_out
        if codes.shape[0] == 0:
            return start, torch.empty(0, dtype=torch.float32)
        if self._stream is not None:
            piece = self._stream.decode(req.stream_state, codes.to(self.device))
        else:
            piece = self._decode_window(req, codes)
        req.num_frames += codes.shape[0]
        req.samples_out += piece.numel()
        return start, piece.float().cpu()

    @torch.inference_mode()
    def decode_many(self, items: list[tuple[str, torch.Tensor]]
                    ) -> list[tuple[int, torch.Tensor] | Exception]:
        """Several requests' new frames, at most one entry per request: ``decode`` of each, in
        one right-padded forward when stateful (``StreamingCode2Wav.decode_batch``: decoding each
        alone, up to float rounding), one after another in window mode. An entry that fails is its
        exception instead of (start, samples): a batched forward that fails changed no state
        and is retried one request at a time, so only a request that fails alone fails."""
        rids = [rid for rid, _ in items]
        if len(set(rids)) != len(rids):
            raise ValueError("decode_many takes at most one entry per request")
        if self._stream is None or len(items) == 1:
            return self._decode_each(items)
        reqs = [self._reqs[rid] for rid in rids]
        starts = [r.samples_out for r in reqs]
        try:
            pieces = self._stream.decode_batch([r.stream_state for r in reqs],  # codes moved
                                               [c for _, c in items])          # in one copy
        except Exception:
            return self._decode_each(items)
        host = torch.cat(pieces).float().cpu().split([p.numel() for p in pieces])  # one copy
        out: list[tuple[int, torch.Tensor] | Exception] = []
        for req, (_, codes), start, piece in zip(reqs, items, starts, host):
            req.num_frames += codes.shape[0]
            req.samples_out += piece.numel()
            out.append((start, piece))
        return out

    def _decode_each(self, items: list[tuple[str, torch.Tensor]]
                     ) -> list[tuple[int, torch.Tensor] | Exception]:
        out: list[tuple[int, torch.Tensor] | Exception] = []
        for rid, codes in items:
            try:
                out.append(self.decode(rid, codes))
            except Exception as e:  # this request only
                out.append(e)
        return out

    def _decode_window(self, req: _Req, codes: torch.Tensor) -> torch.Tensor:
        s, n = req.num_frames, codes.shape[0]
        ctx = min(self.ctx, s)
        left = _tail_frames(req.frames, ctx)
        window = torch.cat([left, codes], dim=0) if ctx else codes
        req.frames.append(codes)
        _trim(req.frames, self.ctx)
        w = self.model(window.T.unsqueeze(0).to(self.device)).reshape(-1)
        if ctx == 0:
            return w
        tail = (n + ctx) * self.samples_per_frame - w.numel()
        return w[ctx * self.samples_per_frame - tail:]

    @torch.inference_mode()
    def decode_all(self, codes: torch.Tensor) -> torch.Tensor:
        """One-shot decode of a whole request's frames [n, 16] (the sync reference)."""
        if codes.shape[0] == 0:
            return torch.empty(0, dtype=torch.float32)
        return self.model(codes.T.unsqueeze(0).to(self.device)).reshape(-1).float().cpu()


def _tail_frames(pieces: list[torch.Tensor], n: int) -> torch.Tensor:
    if n == 0:
        return torch.empty((0, 16), dtype=torch.long)
    return torch.cat(pieces, dim=0)[-n:]


def _trim(pieces: list[torch.Tensor], keep: int) -> None:
    """Drop pieces no longer needed as left context (keeps memory bounded per request)."""
    total = sum(p.shape[0] for p in pieces)
    while pieces and total - pieces[0].shape[0] >= keep:
        total -= pieces.pop(0).shape[0]
