"""The stateful vocoder's padded forwards as CUDA graphs, one per (batch, frames) pair.

With its eager forwards padded to a few shapes (code2wav_shapes.py), a code2wav step of a few
rows still takes 12-15 ms warm on an H100 (session 31's bench): ~1,000 kernel launches from
Python for a few thousand samples, launch-bound, as the first call was before its graph
(code2wav_graph.py: 26 -> 10 ms). A step whose rows all carry state (none is a request's first
call) has, once padded, a static shape; what still depends on Python values in the eager forward
is moved to device tensors here:

- the rows' carried windows live in static buffers, one ``[max batch, ...]`` per carried tensor
  (``StaticRows``): a replay reads rows ``[:B]`` and writes their new windows back in place, each
  cut at its own row's end by a ``gather`` on a device tensor of lengths (the same values as the
  eager forward's slices, so the same bits);
- the codes, the lengths and the rows' positions go in as one host-to-device copy;
- the whole padded waveform comes out; each row's samples are cut on the host after.

A request's state is copied into its row before a replay and out of it after (one multi-tensor
copy each way: ~5 MB a row at the released size); filler rows are not copied in (their output is
dropped, and the rows are independent). All graphs share one memory pool and are replayed one at
a time, their outputs copied out at once, so the pool holds one forward's activations.

Each graph is checked at capture: a replay on random codes, states and lengths must give the
eager forward's samples and states (within ``MAX_DIFF`` of the peak), else that pair stays
eager, and the log says why.
"""

from __future__ import annotations

import logging

import torch

from omni_ray.runners.transformers.code2wav_graph import (MAX_DIFF, _copy_states, _rel_diff,
                                                          _tensors)
from omni_ray.runners.transformers.code2wav_stream import (Code2WavStreamState,
                                                           StreamingCode2Wav, _shallow_copy)

logger = logging.getLogger(__name__)


def _fields(state: Code2WavStreamState):
    """(kind, key, tensor) for each tensor a state carries, in ``_tensors`` order."""
    for kind in ("keys", "values", "conv_tails", "trans_tails"):
        got = getattr(state, kind)
        for key in (range(len(got)) if isinstance(got, list) else got):
            yield kind, key, got[key]


class StaticRows:
    """The forward's rows as static buffers: ``StreamingCode2Wav.run`` reads rows ``[:batch]`` of
    each carried tensor's buffer and writes the rows' new windows back in place."""

    def __init__(self, buffers: dict, batch: int):
        self.buffers, self.batch = buffers, batch
        self.fresh = [False] * batch  # never a request's first call (code2wav_graph.py has those)

    def stacked(self, kind: str, key) -> torch.Tensor:
        return self.buffers[kind, key][:self.batch]

    def keep(self, kind: str, key, x: torch.Tensor, lens: torch.Tensor, width: int) -> None:
        # x[b, :, lens[b]:lens[b] + width] per row b (dim 2 is time), as one gather
        at = lens[:, None] + torch.arange(width, device=x.device)            # [B, width]
        at = at.view(x.shape[0], 1, width, *([1] * (x.dim() - 3))).expand(
            *x.shape[:2], width, *x.shape[3:])
        self.buffers[kind, key][:self.batch].copy_(torch.gather(x, 2, at))

    def row_states(self, n: int) -> list[Code2WavStreamState]:
        """The first ``n`` rows as states whose tensors are views of the buffers."""
        out = []
        for b in range(n):
            s = Code2WavStreamState(keys=[], values=[], conv_tails={}, trans_tails={})
            for (kind, key), buf in self.buffers.items():
                if kind in ("keys", "values"):
                    getattr(s, kind).append(buf[b])
                else:
                    getattr(s, kind)[key] = buf[b]
            out.append(s)
        return out


class StepGraphs:
    """``StreamingCode2Wav``'s padded forwards of rows that all carry state, graphed."""

    def __init__(self, stream: StreamingCode2Wav, batches: tuple[int, ...],
                 frames: tuple[int, ...], capture: bool = True):
        """``capture=False``: the same static buffers and copies, the forward run eagerly on
        them instead of replayed (any device): what the CPU tests check."""
        p = next(stream.model.parameters())
        if capture and p.device.type != "cuda":
            raise RuntimeError("code2wav CUDA graphs need the model on a CUDA device")
        self.stream, self.device, self.capture = stream, p.device, capture
        self.pairs = [(b, f) for b in batches for f in frames]
        self.quantizers = stream.config.num_quantizers
        self.samples_per_frame = int(stream.model.total_upsample)
        self.buffers: dict = {}  # (kind, key) -> [max batch, ...]: made by warm_up
        self._rows: list[Code2WavStreamState] = []  # row b's views of the buffers, made once
        self._row_tensors: list[list[torch.Tensor]] = []  # the same, flat per row
        self._graphs: dict[tuple[int, int], tuple | None] = {}  # None: stays eager
        self.calls = 0  # steps replayed
        self.enabled = True  # False: every step eager (the live setting, Code2WavRunner)

    @property
    def ready(self) -> int:
        """Pairs captured and checked against the eager forward."""
        return sum(g is not None for g in self._graphs.values())

    def applies(self, states: list[Code2WavStreamState], frames: int | None) -> bool:
        """A padded forward (``frames`` set) of a captured pair whose rows all carry state."""
        return (self.enabled and frames is not None
                and self._graphs.get((len(states), frames)) is not None
                and all(s.frames_in > 0 for s in states))

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Capture every pair, the largest first (the pool then fits all), and check each."""
        blank = self.stream.new_state()
        most = max(b for b, _ in self.pairs)
        self.buffers = {(kind, key): torch.zeros((most, *t.shape), dtype=t.dtype, device=t.device)
                        for kind, key, t in _fields(blank)}
        self._rows = StaticRows(self.buffers, most).row_states(most)
        self._row_tensors = [_tensors(r) for r in self._rows]
        pool = torch.cuda.graph_pool_handle() if self.capture else None
        for pair in sorted(self.pairs, key=lambda p: p[0] * p[1], reverse=True):
            try:
                self._graphs[pair] = self._capture(*pair, pool)
            except Exception as e:  # noqa: BLE001 - a failed capture costs speed, not the stage
                logger.warning("code2wav step graph, %d x %d frames: %s: %s; eager instead",
                               *pair, type(e).__name__, e)
                self._graphs[pair] = None
        for pair in self.pairs:  # checked after all captures: the pool is shared
            if self._graphs[pair] is not None:
                try:
                    self._check(*pair)
                except Exception as e:  # noqa: BLE001
                    logger.warning("code2wav step graph, %d x %d frames: %s: %s; eager instead",
                                   *pair, type(e).__name__, e)
                    self._graphs[pair] = None
        if self.capture:
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def __call__(self, states: list[Code2WavStreamState], codes: list[torch.Tensor], frames: int,
                 keep: int) -> list[torch.Tensor]:
        """``StreamingCode2Wav._forward(states, codes, frames, keep)`` by replay: the samples of
        the first ``keep`` rows (the others are fillers); their states advanced."""
        batch = len(states)
        replay, inputs, wav = self._graphs[batch, frames]
        lens = [int(c.shape[0]) for c in codes]
        # padded where the codes are (the host, from the talker), then one copy in
        at = codes[0].device if all(c.device == codes[0].device for c in codes) else self.device
        host = torch.zeros(batch, frames, self.quantizers, dtype=torch.long, device=at)
        for b, c in enumerate(codes):
            host[b, :lens[b]] = c.to(at)
        meta = torch.tensor([*lens, *(s.frames_in for s in states)], dtype=torch.long)
        inputs.copy_(torch.cat([host.view(-1), meta.to(at)]))
        views = self._rows[:keep]  # filler rows are not copied in: their output is dropped
        torch._foreach_copy_([t for b in range(keep) for t in self._row_tensors[b]],
                             [t for s in states[:keep] for t in _tensors(s)])
        replay()
        self.calls += 1
        for v, s, n in zip(views, states, lens):
            v.frames_in = s.frames_in + n
            v.samples_out = s.samples_out + n * self.samples_per_frame
        _copy_states(views, states[:keep])
        full = wav[:keep, 0].to(torch.float32, copy=True)  # out of the pool before the next replay
        return [full[b, :lens[b] * self.samples_per_frame] for b in range(keep)]

    # -- capture -------------------------------------------------------------------------------
    def _capture(self, batch: int, frames: int, pool):
        """(replay, the static input buffer, the static waveform)."""
        stream = self.stream
        inputs = torch.zeros(batch * frames * self.quantizers + 2 * batch, dtype=torch.long,
                             device=self.device)
        codes = inputs[:batch * frames * self.quantizers].view(batch, frames, self.quantizers)
        lens, start = inputs[-2 * batch:-batch], inputs[-batch:]
        lens.fill_(frames)
        start.fill_(1)
        rows = StaticRows(self.buffers, batch)
        if not self.capture:
            wav = torch.zeros(batch, 1, frames * self.samples_per_frame,
                              dtype=next(stream.model.parameters()).dtype, device=self.device)
            return lambda: wav.copy_(stream.run(rows, codes, lens, start)[0]), inputs, wav
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy inits and allocations outside the graph
                stream.run(rows, codes, lens, start)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            wav, _ = stream.run(rows, codes, lens, start)
        return graph.replay, inputs, wav

    def _check(self, batch: int, frames: int) -> None:
        """A replay against the eager forward: random codes, carried states and lengths."""
        gen = torch.Generator().manual_seed(batch * 100 + frames)
        states = []
        for _ in range(batch):
            s = self.stream.new_state()
            for kind, key, t in _fields(s):
                getattr(s, kind)[key] = (torch.randn(t.shape, generator=gen) * 0.5).to(t)
            s.frames_in = int(torch.randint(1, 60, (1,), generator=gen))
            states.append(s)
        lens = [frames] + torch.randint(1, frames + 1, (batch - 1,), generator=gen).tolist()
        codes = [torch.randint(0, self.stream.config.codebook_size, (n, self.quantizers),
                               generator=gen) for n in lens]
        eager_states = [_shallow_copy(s) for s in states]
        want = self.stream._forward(eager_states, [c.to(self.device) for c in codes], frames)
        graph_states = [_shallow_copy(s) for s in states]
        got = self(graph_states, codes, frames, keep=batch)
        pairs = list(zip(got, want))
        for g, w in zip(graph_states, eager_states):
            pairs += zip(_tensors(g), _tensors(w))
            if (g.frames_in, g.samples_out) != (w.frames_in, w.samples_out):
                raise RuntimeError(f"counters {g.frames_in, g.samples_out} != "
                                   f"{w.frames_in, w.samples_out}")
        self.calls -= 1  # the check is not a step
        diff = max(_rel_diff(a, b) for a, b in pairs)
        if diff > MAX_DIFF:
            raise RuntimeError(f"replay differs from the eager forward by {diff:.2e} of the peak")
        logger.info("code2wav step graph, %d x %d frames: replay == eager within %.1e of the "
                    "peak", batch, frames, diff)
