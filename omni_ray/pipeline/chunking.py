"""Turn per-step stage output into chunks for the next stage, by delivery mode.

async_chunk forwards as soon as something useful exists; sync holds everything until the request
finishes and sends one chunk. Both keep ``seq`` gap-free and end with exactly one finished chunk.
"""

from __future__ import annotations

import math
import time

import torch

from omni_ray.payload import CodecChunk, FinishReason, ThinkerChunk


# The talker's prefill needs the first generated token and its first decode steps the next two
# (each step speaks one text token and needs the one after it: runners/transformers/
# talker_inputs.py; the vLLM talker on CUDA sends the first frame from the prefill alone, its
# code predictor behind the sampler), so until this many tokens have gone, text goes at once
# whatever the interval.
TALKER_FIRST_FRAME_TOKENS = 3


class ThinkerChunker:
    """Per request: thinker step outputs -> ThinkerChunks (prompt rides on chunk 0)."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], mode: str,
                 mm_hidden: torch.Tensor | None = None, interval_s: float = 0.0,
                 clock=time.monotonic):
        """``interval_s``: in async_chunk, a chunk goes at most this often (the first
        ``TALKER_FIRST_FRAME_TOKENS`` tokens at once, the last when the request finishes);
        tokens in between wait for the next."""
        self.request_id = request_id
        self.interval_s, self.clock = interval_s, clock
        self.sent_at = -float("inf")
        self.prompt = list(prompt_token_ids)
        self.mm_hidden = mm_hidden
        self.image_grid_thw: torch.Tensor | None = None
        self.audio_feature_lengths: torch.Tensor | None = None
        self.stream = mode == "async_chunk"
        self.seq = 0
        self.sent_tokens = 0
        self.pending: list[int] = []

    def set_mm(self, hidden: torch.Tensor, image_grid_thw: torch.Tensor | None,
               audio_feature_lengths: torch.Tensor | None) -> None:
        """The multimodal prompt context (from the prefill); it rides on chunk 0."""
        if self.seq != 0:
            raise RuntimeError(f"{self.request_id}: multimodal context after chunk 0 was sent")
        self.mm_hidden = hidden
        self.image_grid_thw, self.audio_feature_lengths = image_grid_thw, audio_feature_lengths

    def add(self, token_ids: list[int], finished: bool,
            reason: FinishReason = FinishReason.NONE) -> list[ThinkerChunk]:
        self.pending.extend(token_ids)
        if not (self.stream or finished):
            return []
        first = self.seq == 0
        eager = first or (self.pending and self.sent_tokens < TALKER_FIRST_FRAME_TOKENS)
        if self.interval_s > 0 and not (eager or finished) and (
                not self.pending or self.clock() - self.sent_at < self.interval_s):
            return []
        self.sent_at = self.clock()
        chunk = ThinkerChunk(
            request_id=self.request_id, seq=self.seq, token_ids=self.pending, finished=finished,
            finish_reason=reason if finished else FinishReason.NONE,
            prompt_token_ids=self.prompt if first else None,
            mm_hidden=self.mm_hidden if first else None,
            image_grid_thw=self.image_grid_thw if first else None,
            audio_feature_lengths=self.audio_feature_lengths if first else None,
        )
        self.seq += 1
        self.sent_tokens += len(self.pending)
        self.pending = []
        return [chunk]


class CodecChunker:
    """Per request: talker frames -> CodecChunks of ``initial`` frames, then ``size`` frames;
    with ``ramp``, each chunk after the first has ``ratio`` x the frames already sent (rounded
    up) up to ``size``: at ratio 1 (1, 1, 2, 4, ...) a chunk takes no longer to make than the
    audio already sent lasts, at any RTF < 1.

    ``hold_first`` (set by the talker before the first chunk is complete): the first chunk waits
    for the second and both go in one ``add``, so playback starts with both buffered. The chunks
    themselves do not change (nor, in stateful code2wav, the audio)."""

    def __init__(self, request_id: str, mode: str, initial: int, size: int, groups: int = 16,
                 ramp: bool = False, ratio: float = 1.0):
        self.request_id = request_id
        self.stream = mode == "async_chunk"
        self.initial, self.size, self.groups, self.ramp = initial, size, groups, ramp
        self.ratio = ratio
        self.want = initial  # the next chunk's size
        self.seq = 0
        self.start = 0
        self.pending: list[torch.Tensor] = []
        self.num_pending = 0
        self.hold_first = False
        self.held: CodecChunk | None = None  # the first chunk, while it waits for the second

    def add(self, frames: torch.Tensor, finished: bool,
            reason: FinishReason = FinishReason.NONE) -> list[CodecChunk]:
        if frames.numel():
            self.pending.append(frames)
            self.num_pending += frames.shape[0]
        out = []
        while (self.stream and self.num_pending >= self.want
               and not (finished and self.num_pending == self.want)):
            out.append(self._emit(self.want, False, FinishReason.NONE))
            self.want = self._next_size() if self.ramp else self.size
        if finished:
            out.append(self._emit(self.num_pending, True, reason))
        if self.held is not None and out:
            out.insert(0, self.held)
            self.held = None
        elif self.hold_first and len(out) == 1 and out[0].seq == 0 and not out[0].finished:
            self.held = out.pop()
        return out

    def _next_size(self) -> int:
        """``ratio`` x the frames sent so far, rounded up (a float's last bit aside), 1 to
        ``size``."""
        return min(max(1, math.ceil(self.ratio * self.start - 1e-9)), self.size)

    def _emit(self, n: int, finished: bool, reason: FinishReason) -> CodecChunk:
        allf = (torch.cat(self.pending, dim=0) if self.pending
                else torch.empty((0, self.groups), dtype=torch.long))
        codes, rest = allf[:n], allf[n:]
        self.pending = [rest] if rest.shape[0] else []
        self.num_pending = rest.shape[0]
        chunk = CodecChunk(request_id=self.request_id, seq=self.seq, start_frame=self.start,
                           codes=codes.contiguous(), finished=finished, finish_reason=reason)
        self.seq += 1
        self.start += n
        return chunk
