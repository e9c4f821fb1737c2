"""The stateful vocoder's first call of a request as one CUDA graph per batch-size bucket.

A request's first audio waits for code2wav's first call on its first chunk (one 80 ms frame in
the GPU configs). That call is small (1,920 samples) but runs the whole vocoder: ~1,000 kernel
launches from Python, launch-bound (measured on an H200 at real size, bf16: 18-26 ms for one
frame, most of the stage's part of the time to first audio). A first call always starts from the
same fresh state (``StreamingCode2Wav.new_state``: zeros) and, for a given number of frames, has
static shapes, so ``StreamingCode2Wav._forward`` is captured once per bucket of requests (up to
the stage's batch) and replayed with one launch; later calls (other lengths, carried state) stay
eager. ``Code2WavLogic`` decodes new requests' first chunks in a step of their own
(``first_chunks_first``), so under load too a first call is a batch of fresh states.

Each capture is checked before it is used: a replay on random codes must give the eager
forward's samples and states (bit-equal on the devices seen; within ``MAX_DIFF`` of the peak
otherwise), else that bucket stays eager, and the log says why.
"""

from __future__ import annotations

import logging

import torch

from omni_ray.runners.transformers.code2wav_stream import (Code2WavStreamState,
                                                           StreamingCode2Wav)

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32)  # code2wav_max_batch: 32 on the GPU
MAX_DIFF = 1e-3  # of each tensor's peak (samples, state): a wrong capture differs by O(1)


class FirstCallGraphs:
    """``StreamingCode2Wav``'s first call on ``frames`` new frames per request, graphed."""

    def __init__(self, stream: StreamingCode2Wav, frames: int):
        p = next(stream.model.parameters())
        if p.device.type != "cuda":
            raise RuntimeError("code2wav CUDA graphs need the model on a CUDA device")
        self.stream, self.frames, self.device = stream, frames, p.device
        self.quantizers = stream.config.num_quantizers
        self.codebook = stream.config.codebook_size
        self._graphs: dict[int, tuple | None] = {}  # bucket -> capture, None: stays eager
        self.calls = 0  # first calls replayed

    @property
    def ready(self) -> int:
        """Buckets captured and checked against the eager forward."""
        return sum(g is not None for g in self._graphs.values())

    def applies(self, states: list[Code2WavStreamState], codes: list[torch.Tensor]) -> bool:
        """Every request fresh, with exactly ``frames`` new frames, and a bucket for them."""
        return (0 < len(states) <= BUCKETS[-1] and all(s.frames_in == 0 for s in states)
                and all(c.shape[0] == self.frames for c in codes)
                and self._entry(len(states)) is not None)

    def warm_up(self) -> None:
        """Capture (and check) every bucket now, not under the first requests."""
        for b in BUCKETS:
            self._entry(b)

    @torch.inference_mode()  # the buffers are inference tensors (captured in that mode)
    def __call__(self, states: list[Code2WavStreamState], codes: list[torch.Tensor]
                 ) -> list[torch.Tensor]:
        """``StreamingCode2Wav._forward(states, codes)`` by replay: the samples per request;
        each state advanced (its tensors copied out of the graph's buffers)."""
        n = len(states)
        graph, codes_in, work, wavs, _ = self._entry(n)
        self.calls += 1
        codes_in[:n].copy_(torch.stack([c.to(codes[0].device) for c in codes]))  # one copy in
        graph.replay()
        _copy_states(work[:n], states)
        return [wavs[b].clone() for b in range(n)]

    # -- capture -------------------------------------------------------------------------------
    def _entry(self, n: int):
        bucket = next(b for b in BUCKETS if b >= n)
        if bucket not in self._graphs:
            try:
                self._graphs[bucket] = self._capture(bucket)
            except Exception as e:  # noqa: BLE001 - a failed capture costs speed, not the stage
                logger.warning("code2wav first-call graph, %d requests: %s: %s; eager instead",
                               bucket, type(e).__name__, e)
                self._graphs[bucket] = None
        return self._graphs[bucket]

    @torch.inference_mode()
    def _capture(self, bucket: int):
        stream = self.stream
        codes_in = torch.zeros((bucket, self.frames, self.quantizers), dtype=torch.long,
                               device=self.device)
        fresh = [stream.new_state() for _ in range(bucket)]  # never written: the forward
        side = torch.cuda.Stream()                           # assigns new tensors
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy inits and allocations outside the graph
                stream._forward(_fresh_copies(fresh), list(codes_in))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        work = _fresh_copies(fresh)
        with torch.cuda.graph(graph):
            wavs = stream._forward(work, list(codes_in))
        self._check(graph, codes_in, work, wavs, bucket)
        return graph, codes_in, work, wavs, fresh  # fresh: the graph reads it, keep it alive

    def _check(self, graph, codes_in, work, wavs, bucket: int) -> None:
        gen = torch.Generator(device=self.device).manual_seed(bucket)
        codes_in.copy_(torch.randint(0, self.codebook, codes_in.shape, generator=gen,
                                     device=self.device))
        graph.replay()
        eager_states = [self.stream.new_state() for _ in range(bucket)]
        eager = self.stream._forward(eager_states, [c.clone() for c in codes_in])
        pairs = list(zip(wavs, eager))
        for got, want in zip(work, eager_states):
            pairs += zip(_tensors(got), _tensors(want))
        diff = max(_rel_diff(a, b) for a, b in pairs)  # samples and every state tensor
        if diff > MAX_DIFF:
            raise RuntimeError(f"replay differs from the eager forward by {diff:.2e} of the peak")
        logger.info("code2wav first-call graph, %d requests x %d frames: replay == eager "
                    "within %.1e of the peak", bucket, self.frames, diff)


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    peak = float(b.float().abs().max()) or 1.0
    return float((a.float() - b.float()).abs().max()) / peak


def _fresh_copies(states: list[Code2WavStreamState]) -> list[Code2WavStreamState]:
    from omni_ray.runners.transformers.code2wav_stream import _shallow_copy

    return [_shallow_copy(s) for s in states]


def _tensors(s: Code2WavStreamState) -> list[torch.Tensor]:
    return [*s.keys, *s.values, *s.conv_tails.values(), *s.trans_tails.values()]


def _copy_states(srcs: list[Code2WavStreamState], dsts: list[Code2WavStreamState]) -> None:
    """Each ``dst`` becomes its ``src`` (a state whose tensors live in the graph's buffers), by
    value: all their tensors in one multi-tensor copy (a few launches on CUDA, not ~40 clones a
    request)."""
    src = [t for s in srcs for t in _tensors(s)]
    dst = [torch.empty_like(t) for t in src]
    torch._foreach_copy_(dst, src)
    copies = iter(dst)
    for s, d in zip(srcs, dsts):
        d.keys = [next(copies) for _ in s.keys]
        d.values = [next(copies) for _ in s.values]
        d.conv_tails = {k: next(copies) for k in s.conv_tails}
        d.trans_tails = {k: next(copies) for k in s.trans_tails}
        d.frames_in, d.samples_out = s.frames_in, s.samples_out
