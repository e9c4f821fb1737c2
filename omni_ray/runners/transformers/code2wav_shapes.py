"""The stateful vocoder's eager forwards at a few shapes: padded up, each run once at start.

On CUDA a code2wav forward of a (batch, frames) not met before first builds its convolutions'
kernels (cuDNN plans per input shape). Measured on an H100 (half-thinker stand-in, bf16, session
31): such a step took 92-110 ms at p50 against 28-33 ms for the others, and under load the
shapes keep coming (9 of 33 code2wav steps at concurrency 8, 22 of 100 at 32, 14 of 122 in a
second run of 32 on the same app), because every pair of batch size and longest chunk is one.

So ``StreamingCode2Wav.decode_batch`` pads an eager forward up to the next of a few sizes, as
vLLM does for its CUDA graphs: the batch to 1, 2, 4, ... up to the stage's batch, with rows of a
blank stream whose output is dropped; the frames to the next of 1, 2, 4, ... and the pipeline's
chunk sizes (a chunk longer than all of them runs as it is). ``warm_up`` runs every pair once at
start. Padding changes no request's audio in exact arithmetic: every layer is causal, so right-
padded frames only touch samples after a request's own end, which are discarded, each state is
taken at its own request's end, and extra rows are rows of their own. In floating point the
kernels chosen for the padded shape round differently, as batching already does; so padding is
on where code2wav batches (``PipelineConfig.code2wav_shapes`` decides the sizes: bf16/fp16), not
in float32.
"""

from __future__ import annotations

import dataclasses

import torch

from omni_ray.runners.transformers.code2wav_stream import (Code2WavStreamState,
                                                           StreamingCode2Wav, _shallow_copy)


class ShapeBuckets:
    """Pads ``stream``'s eager forwards to (batch, frames) pairs from ``batches`` x ``frames``."""

    def __init__(self, stream: StreamingCode2Wav, batches: tuple[int, ...],
                 frames: tuple[int, ...]):
        self.stream = stream
        self.batches, self.frames = tuple(sorted(batches)), tuple(sorted(frames))
        self._blank = stream.new_state()  # a fresh stream: the filler rows' state, never written
        self.device = next(stream.model.parameters()).device
        self._codes: dict[torch.device, torch.Tensor] = {}  # a filler row's frame, per device
        self.warmed = 0  # pairs run by warm_up

    def pad(self, states: list[Code2WavStreamState], codes: list[torch.Tensor]):
        """``(states, codes, frames)``: the batch filled up to its size with blank rows (after
        the real ones), and the frames to pad every row to (None: the longest, unpadded)."""
        longest = max(int(c.shape[0]) for c in codes)
        frames = next((f for f in self.frames if f >= longest), None)
        size = next((b for b in self.batches if b >= len(states)), len(states))
        fill = [self._filler(states[0].frames_in) for _ in range(size - len(states))]
        # where the real rows' codes are (the host, from the talker): the forward pads them
        # there and copies the batch to the device once
        return states + fill, codes + [self._frame(codes[0].device)] * len(fill), frames

    @torch.no_grad()
    def warm_up(self) -> None:
        """Run every (batch, frames) pair once, so serving meets none of them first."""
        for b in self.batches:
            for f in self.frames:
                states = [self._filler(0) for _ in range(b)]
                self.stream._forward(states, [self._frame(self.device)] * b, frames=f)
                self.stream.shapes.add((b, f))
                self.warmed += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _frame(self, device: torch.device) -> torch.Tensor:
        if device not in self._codes:  # one frame of code 0 (any valid id)
            self._codes[device] = torch.zeros((1, self.stream.config.num_quantizers),
                                              dtype=torch.long, device=device)
        return self._codes[device]

    def _filler(self, frames_in: int) -> Code2WavStreamState:
        # a shallow copy: the forward assigns new tensors to it, the blank's stay zeros; its
        # position follows the first real row's, so the batch keeps one position when theirs do
        return dataclasses.replace(_shallow_copy(self._blank), frames_in=frames_in)
