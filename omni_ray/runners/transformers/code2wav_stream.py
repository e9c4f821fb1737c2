"""Stateful streaming code2wav: exact chunked Qwen3-Omni audio without re-decoding left context.

`Qwen3OmniMoeCode2Wav` is causal end to end: a sliding-window causal transformer, then stride-1
causal convolutions (left zero padding), causal transposed convolutions and pointwise layers
(SnakeBeta, LayerNorm, Linear, GELU, clamp). So every output sample depends only on codes up to
its frame, and a decoder that carries each layer's finite memory across calls reproduces the
one-shot waveform. `StreamingCode2Wav.decode(state, new_codes)` runs the module's own submodules
(and their parameters, through `torch.nn.functional`) on the new frames only, prepending each
layer's carried input:

- **Attention layers** (window W): keys and values of the last W-1 frames, after RoPE, as a
  fixed `[kv_heads, W-1, head_dim]` buffer (zeros before the first frame, masked out). New
  queries get RoPE at absolute positions `frames_in + i`, the position counter. One-shot attention
  lets query q see keys k with `q - W < k <= q`; the keys older than W-1 frames are exactly the ones
  no new query can see, so dropping them changes nothing and the buffer never grows.
- **Causal convolutions** (stride 1, kernel k, dilation d; includes ConvNeXt's depthwise conv):
  the last `(k-1)*d` input samples. One-shot pads `(k-1)*d` zeros on the left; the state starts as
  those zeros and afterwards holds the real preceding samples, so `conv1d(cat(tail, new))` with no
  padding yields exactly the one-shot outputs for the new samples. Kernel-1 convs carry nothing.
- **Causal transposed convolutions** (kernel k, stride s, k <= 2s): one-shot trims `k-s` samples
  on both ends; output block i (s samples) sums `x[i]` through taps `0..s-1` and `x[i-1]` through
  taps `s..k-1`. The overlap a call still owes to the next block is that second term, and we carry
  it as the input that produces it, `x[last]` (`ceil(k/s)-1` input samples): re-applying the
  same op to `cat(x_last, new)` is exact, and smaller than carrying `s` output samples. On the
  first call there is no predecessor; one-shot drops the first `k-s` samples, so we do too. The
  last block (which needs the next input) is the withheld audio: with rates 8/5/4/3 that adds up
  to 555 samples, so after N frames exactly `N*1920 - 555` samples have been emitted. Transposed
  convs with k == s (the x2 upsamplers) owe nothing and carry nothing.
- Embedding, norms, MLPs, SnakeBeta and clamp are per frame or per sample and carry nothing.

The arithmetic is the module's own, op for op, so the stream equals one-shot decoding exactly in
exact arithmetic. In float32 on CPU it agrees to ~1-3e-6 of the peak (seen on random weights, tiny
and released sizes): oneDNN/MKL/SDPA choose kernels and thread splits by tensor size, so values
round differently for a 25-frame chunk than inside a 300-frame forward. That is the one-shot
decoder's own noise level: decoding N-7 frames one-shot differs from decoding N frames on the
shared samples by ~1e-6 (tiny) to ~2.4e-6 (released size) of the peak. One source is removed:
PyTorch would run small batch-1 convs on THNN instead of oneDNN (see `_on_long_input_backend`).

State size is fixed per model (5.2 MB at the released size, 4.7 MB of it the 8 layers'
key/value windows); it never grows with the stream. A request's state is a plain object: its
owner creates it with `new_state()` and simply drops it on finish or abort; there is nothing to
free. `decode_batch` runs requests with different states and frame counts in one forward: new
frames are right-padded to the longest request, and since every layer is causal the padding only
touches samples after each request's valid prefix, which are discarded; each state is taken at
its own request's end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
    apply_rotary_pos_emb,
)

__all__ = ["Code2WavStreamState", "StreamingCode2Wav", "reinit_code2wav_for_testing"]


@dataclasses.dataclass
class Code2WavStreamState:
    """Everything one request's stream carries between `decode` calls; fixed size.

    A plain object with no resources behind it: the owner drops it when the request finishes or
    is aborted (there is no `free`). Never share one between requests or decode it concurrently.
    """

    keys: list[torch.Tensor]  # per attention layer: [kv_heads, window-1, head_dim], post-RoPE
    values: list[torch.Tensor]  # per attention layer: [kv_heads, window-1, head_dim]
    conv_tails: dict[str, torch.Tensor]  # causal conv name -> last (k-1)*d inputs [C_in, (k-1)*d]
    trans_tails: dict[str, torch.Tensor]  # transposed conv name -> last inputs [C_in, ceil(k/s)-1]
    frames_in: int = 0  # frames decoded so far; also the next frame's RoPE position
    samples_out: int = 0  # samples emitted so far: frames_in * 1920 - 555 once frames_in >= 1

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, *self.conv_tails.values(), *self.trans_tails.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def _shallow_copy(state: Code2WavStreamState) -> Code2WavStreamState:
    """New containers over the same tensors: the forward only ever assigns new tensors."""
    return dataclasses.replace(state, keys=list(state.keys), values=list(state.values),
                               conv_tails=dict(state.conv_tails),
                               trans_tails=dict(state.trans_tails))


@dataclasses.dataclass
class _Ragged:
    """A right-padded batch whose row b is valid in [:lens[b]]; the rest is ignored."""

    x: torch.Tensor  # [B, C, T] channels first
    lens: list[int] | torch.Tensor  # valid samples per row (a device tensor in a CUDA graph)


class RowStates:
    """The forward's rows as their requests' states: each layer's carried window stacked from
    them, and each row's new window cut at its own end into its own state (fresh tensors: a
    state must not keep the batch's alive). ``kind`` is a ``Code2WavStreamState`` field
    (``keys``, ``values``, ``conv_tails``, ``trans_tails``), ``key`` its layer index or name."""

    def __init__(self, states: list[Code2WavStreamState]):
        self.states = states
        self.fresh = [s.frames_in == 0 for s in states]  # first calls: a request's first samples

    def stacked(self, kind: str, key) -> torch.Tensor:
        return torch.stack([getattr(s, kind)[key] for s in self.states])

    def keep(self, kind: str, key, x: torch.Tensor, lens: list[int], width: int) -> None:
        for s, window in zip(self.states, _rows_at(x, lens, width)):
            getattr(s, kind)[key] = window


class StreamingCode2Wav:
    """Decodes codec frames incrementally with a loaded `Qwen3OmniMoeCode2Wav`'s weights."""

    def __init__(self, model: Qwen3OmniMoeCode2Wav):
        if not isinstance(model, Qwen3OmniMoeCode2Wav):
            raise TypeError(f"expected Qwen3OmniMoeCode2Wav, got {type(model).__name__}")
        self.model = model
        self.config = model.config
        self.window = int(self.config.sliding_window)
        if self.window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.window}")
        if any(t != "sliding_attention" for t in self.config.layer_types):
            raise ValueError(f"only sliding-window layers carry bounded state: {self.config.layer_types}")
        attn = model.pre_transformer.layers[0].self_attn
        self.kv_heads = self.config.num_key_value_heads
        self.head_dim = attn.head_dim
        self._names = {mod: name for name, mod in model.named_modules()}
        self.first_graphs = None  # FirstCallGraphs (code2wav_graph.py): first calls, replayed
        self.buckets = None  # ShapeBuckets (code2wav_shapes.py): eager forwards padded up
        self.step_graphs = None  # StepGraphs (code2wav_step_graphs.py): padded forwards, replayed
        # The eager forwards' (batch, frames) so far: on CUDA a forward of a new pair builds its
        # convolutions' kernels (cuDNN's plans per input shape) before it runs.
        self.shapes: set[tuple[int, int]] = set()
        self.forwards = 0
        self._snake_factors: dict[nn.Module, tuple] = {}  # SnakeBeta -> (version, alpha, 1/beta)
        for name, mod in model.named_modules():
            if isinstance(mod, Qwen3OmniMoeCausalConvNet) and mod.stride != 1:
                raise ValueError(f"{name}: strided causal convs are not supported")
            if isinstance(mod, Qwen3OmniMoeCausalTransConvNet):
                k, s = mod.conv.kernel_size[0], mod.conv.stride[0]
                if not s <= k <= 2 * s:
                    raise ValueError(f"{name}: transposed conv kernel {k} stride {s} needs s <= k <= 2s")

    # ---- state -------------------------------------------------------------------------------

    def new_state(self) -> Code2WavStreamState:
        """A fresh request: zero tails are exactly one-shot decoding's left zero padding."""
        p = next(self.model.parameters())
        kw = {"device": p.device, "dtype": p.dtype}
        layers = len(self.model.pre_transformer.layers)
        cache = (self.kv_heads, self.window - 1, self.head_dim)
        conv_tails, trans_tails = {}, {}
        for name, mod in self.model.named_modules():
            if isinstance(mod, Qwen3OmniMoeCausalConvNet):
                conv_tails[name] = torch.zeros(mod.conv.in_channels, mod.padding, **kw)
            elif isinstance(mod, Qwen3OmniMoeCausalTransConvNet):
                k, s = mod.conv.kernel_size[0], mod.conv.stride[0]
                trans_tails[name] = torch.zeros(mod.conv.in_channels, math.ceil(k / s) - 1, **kw)
        return Code2WavStreamState(
            keys=[torch.zeros(cache, **kw) for _ in range(layers)],
            values=[torch.zeros(cache, **kw) for _ in range(layers)],
            conv_tails=conv_tails,
            trans_tails=trans_tails,
        )

    # ---- public decode -----------------------------------------------------------------------

    def decode(self, state: Code2WavStreamState, codes: torch.Tensor) -> torch.Tensor:
        """New frames `[n, 16]` int64 -> the samples (1-D float) that became final; updates state."""
        return self.decode_batch([state], [codes])[0]

    @torch.no_grad()
    def decode_batch(self, states: list[Code2WavStreamState], codes: list[torch.Tensor]) -> list[torch.Tensor]:
        """Decodes several requests' new frames in one right-padded forward; one output per request."""
        if len(states) != len(codes):
            raise ValueError(f"{len(states)} states but {len(codes)} code tensors")
        q = self.config.num_quantizers
        for c in codes:
            if c.dim() != 2 or c.shape[1] != q:
                raise ValueError(f"codes must be [frames, {q}], got {tuple(c.shape)}")
        p = next(self.model.parameters())
        outs = [torch.zeros(0, dtype=torch.float32, device=p.device) for _ in states]
        live = [i for i, c in enumerate(codes) if c.shape[0] > 0]
        if not live:
            return outs
        # The forward advances working copies; the states change only once it has succeeded,
        # so a failed batch leaves every request where it was (each can be retried alone).
        work = [_shallow_copy(states[i]) for i in live]
        new = [codes[i] for i in live]
        graphs = self.first_graphs
        if graphs is not None and graphs.applies(work, new):
            wavs = graphs(work, new)
        else:
            rows, frames = work, None
            if self.buckets is not None:  # filler rows after the real ones, dropped below
                rows, new, frames = self.buckets.pad(work, new)
            self._count_shape(len(rows), frames or max(int(c.shape[0]) for c in new))
            steps = self.step_graphs
            if steps is not None and steps.applies(rows, frames):
                wavs = steps(rows, new, frames, keep=len(work))
            else:
                wavs = self._forward(rows, new, frames, keep=len(work))
        for i, w, done in zip(live, wavs, work):
            outs[i] = w
            states[i].__dict__.update(done.__dict__)
        return outs

    def _count_shape(self, batch: int, frames: int) -> None:
        self.forwards += 1
        self.shapes.add((batch, frames))

    @property
    def new_shapes(self) -> int:
        """Forwards of a (batch, frames) not run before: one per shape met (those a start-up
        warm-up ran are not new)."""
        return len(self.shapes) - (self.buckets.warmed if self.buckets is not None else 0)

    # ---- the forward, stage by stage ---------------------------------------------------------

    def _forward(self, states: list[Code2WavStreamState], codes: list[torch.Tensor],
                 frames: int | None = None, keep: int | None = None) -> list[torch.Tensor]:
        """One forward of every row, right-padded to its longest, or to ``frames`` when given;
        the samples of the first ``keep`` rows (all: None), the others are fillers whose output
        is never cut out (code2wav_shapes.py)."""
        dev = self.model.code_embedding.weight.device
        lens = [int(c.shape[0]) for c in codes]
        # Right-pad with code 0 (any valid id) where the codes are (the host, from the talker),
        # then one copy to the device: one host-to-device copy (each waits for the GPU) a
        # forward, not one a request.
        at = codes[0].device if all(c.device == codes[0].device for c in codes) else dev
        steps = max(lens) if frames is None else max(frames, *lens)
        padded = torch.zeros(len(codes), steps, self.config.num_quantizers, dtype=torch.long, device=at)
        for b, c in enumerate(codes):
            padded[b, : lens[b]] = c.to(at)
        frames_in = {s.frames_in for s in states}
        if len(frames_in) == 1:  # a fill, not a host copy: capturable (code2wav_graph.py)
            start = torch.full((len(states),), frames_in.pop(), dtype=torch.long, device=dev)
        else:
            start = torch.tensor([s.frames_in for s in states], device=dev)
        wav, out_lens = self.run(RowStates(states), padded.to(dev), lens, start)
        out = []
        for b, state in enumerate(states[:keep]):  # each request's valid samples; its counters
            out.append(wav[b, 0, : out_lens[b]].to(torch.float32).clone())
            state.frames_in += lens[b]
            state.samples_out += out_lens[b]
        return out

    def run(self, rows, codes: torch.Tensor, lens, start: torch.Tensor):
        """The forward proper: ``codes`` ``[B, T, 16]`` on the device (row b valid in
        ``[:lens[b]]``), ``start`` ``[B]`` each row's first frame position; the rows' carried
        windows read and written through ``rows`` (``RowStates``, or static buffers for a CUDA
        graph: code2wav_step_graphs.py, where ``lens`` is a device tensor). Returns the clamped
        waveform ``[B, 1, S]`` and each row's valid samples (a list, or a tensor like ``lens``)."""
        model = self.model
        # 1) Embed; the mean over quantizers is per frame.
        hidden = model.code_embedding(codes.transpose(1, 2) + model.code_offset).mean(1)
        # 2) Sliding-window transformer over the new frames, attending to carried keys/values.
        hidden = self._transformer(rows, hidden, lens, start)
        # 3) Upsamplers and decoder: causal convs with carried tails, channels first.
        ragged = _Ragged(hidden.permute(0, 2, 1), lens)
        for blocks in model.upsample:
            for block in blocks:
                ragged = self._layer(block, rows, ragged)
        for block in model.decoder:
            ragged = self._layer(block, rows, ragged)
        return ragged.x.clamp(min=-1, max=1), ragged.lens

    def _transformer(self, rows, hidden: torch.Tensor, lens, start: torch.Tensor) -> torch.Tensor:
        pre = self.model.pre_transformer
        steps = hidden.shape[1]
        cached = self.window - 1
        dev = hidden.device
        positions = start[:, None] + torch.arange(steps, device=dev)[None]  # [B, T] absolute
        cos, sin = pre.rotary_emb(hidden, positions)
        # Key j sits at relative frame j - cached (the cache holds the `cached` frames before start).
        rel_k = torch.arange(cached + steps, device=dev) - cached
        rel_q = torch.arange(steps, device=dev)
        seen = (rel_k[None, :] <= rel_q[:, None]) & (rel_k[None, :] > rel_q[:, None] - self.window)
        exists = (start[:, None] + rel_k[None, :]) >= 0  # [B, K]: cache slots before frame 0 are empty
        mask = (seen[None] & exists[:, None, :])[:, None]  # [B, 1, T, K]
        for i, layer in enumerate(pre.layers):
            residual = hidden
            attn_out = self._attention(layer.self_attn, i, rows, layer.input_layernorm(hidden), cos, sin, mask, lens)
            hidden = residual + layer.self_attn_layer_scale(attn_out)
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return pre.norm(hidden)

    def _attention(self, attn, i, rows, x, cos, sin, mask, lens) -> torch.Tensor:
        batch, steps, _ = x.shape
        shape = (batch, steps, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        # 1) Prepend the carried window; 2) keep each request's last W-1 keys at its own end.
        k = torch.cat([rows.stacked("keys", i), k], dim=2)
        v = torch.cat([rows.stacked("values", i), v], dim=2)
        rows.keep("keys", i, k, lens, self.window - 1)
        rows.keep("values", i, v, lens, self.window - 1)
        groups = attn.num_key_value_groups
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        with _sdpa_backends(q.device):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
        return attn.o_proj(out.transpose(1, 2).reshape(batch, steps, -1))

    def _layer(self, mod: nn.Module, rows, r: _Ragged) -> _Ragged:
        """Runs one decoder-side layer on the ragged batch, threading its per-request state."""
        if isinstance(mod, Qwen3OmniMoeCausalConvNet):
            return self._causal_conv(mod, rows, r)
        if isinstance(mod, Qwen3OmniMoeCausalTransConvNet):
            return self._trans_conv(mod, rows, r)
        if isinstance(mod, Qwen3OmniMoeConvNeXtBlock):
            h = self._causal_conv(mod.dwconv, rows, r).x.permute(0, 2, 1)
            h = mod.pwconv2(mod.act(mod.pwconv1(mod.norm(h))))
            return _Ragged(r.x + (mod.gamma * h).permute(0, 2, 1), r.lens)
        if isinstance(mod, Qwen3OmniMoeCode2WavDecoderBlock):
            for sub in mod.block:
                r = self._layer(sub, rows, r)
            return r
        if isinstance(mod, Qwen3OmniMoeCode2WavDecoderResidualUnit):
            h = self._causal_conv(mod.conv1, rows, _Ragged(self._snake(mod.act1, r.x), r.lens))
            h = self._causal_conv(mod.conv2, rows, _Ragged(self._snake(mod.act2, h.x), r.lens))
            return _Ragged(h.x + r.x, r.lens)
        if isinstance(mod, Qwen3OmniMoeSnakeBeta):
            return _Ragged(self._snake(mod, r.x), r.lens)  # pointwise
        raise TypeError(f"no streaming rule for {type(mod).__name__}: refusing to guess its state")

    def _snake(self, mod: Qwen3OmniMoeSnakeBeta, x: torch.Tensor) -> torch.Tensor:
        """``mod(x)`` with its per-channel factors computed once, not per call (4 of its 9
        kernels a call, ~30 calls a forward); the same ops on the same values, so the same
        bits."""
        key = (mod.alpha.data_ptr(), mod.alpha._version, mod.beta.data_ptr(), mod.beta._version)
        got = self._snake_factors.get(mod)
        if got is None or got[0] != key:
            alpha = torch.exp(mod.alpha.unsqueeze(0).unsqueeze(-1))  # transformers' own steps
            scale = 1.0 / (torch.exp(mod.beta.unsqueeze(0).unsqueeze(-1)) + mod.no_div_by_zero)
            got = self._snake_factors[mod] = (key, alpha, scale)
        _, alpha, scale = got
        return x + scale * torch.pow(torch.sin(x * alpha), 2)

    def _causal_conv(self, mod: Qwen3OmniMoeCausalConvNet, rows, r: _Ragged) -> _Ragged:
        """Stride-1 causal conv: `cat(tail, new)` without padding gives the one-shot outputs."""
        name = self._names[mod]
        conv, pad = mod.conv, mod.padding
        x = r.x
        if pad > 0:
            x = torch.cat([rows.stacked("conv_tails", name), x], dim=2)
            rows.keep("conv_tails", name, x, r.lens, pad)
        y = _on_long_input_backend(
            lambda t: F.conv1d(t, conv.weight, conv.bias, dilation=conv.dilation, groups=conv.groups), x
        )
        return _Ragged(y, r.lens)

    def _trans_conv(self, mod: Qwen3OmniMoeCausalTransConvNet, rows, r: _Ragged) -> _Ragged:
        """Causal transposed conv: re-applied to `cat(last inputs, new)`, emitting only final blocks."""
        name = self._names[mod]
        conv = mod.conv
        k, s = conv.kernel_size[0], conv.stride[0]
        carry = math.ceil(k / s) - 1
        x = r.x
        if carry > 0:
            x = torch.cat([rows.stacked("trans_tails", name), x], dim=2)
            rows.keep("trans_tails", name, x, r.lens, carry)
        full = _on_long_input_backend(lambda t: F.conv_transpose1d(t, conv.weight, conv.bias, stride=s), x)
        # full: length (carry + T - 1) * s + k
        steps = r.x.shape[2]
        # A first call has no predecessor: like one-shot, drop the first k-s samples.
        drops = [k - s if fresh else 0 for fresh in rows.fresh]
        if isinstance(r.lens, torch.Tensor):  # static rows: never a first call (no drops)
            assert not any(drops), "a graphed step has no request's first call"
            lens = r.lens * s
        else:
            lens = [n * s - d for n, d in zip(r.lens, drops)]
        lo = carry * s
        if len(set(drops)) == 1:
            y = full[:, :, lo + drops[0] : lo + drops[0] + steps * s]
        else:
            y = torch.stack([full[b, :, lo + d : lo + d + steps * s] for b, d in enumerate(drops)])
        return _Ragged(y, lens)


def _sdpa_backends(device: torch.device):
    """On CUDA, attention without cuDNN's backend: PyTorch picks it for a masked attention on an
    H100/H200, and it builds a graph per new shape (chunk lengths and batches vary by call) at
    ~0.7 ms of host time a call in steady state (session 14's profile: 4.7 ms of a code2wav
    step's ~50 ms host, against ~10 ms of device time); the memory-efficient kernel takes the
    same mask."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _rows_at(x: torch.Tensor, starts: list[int], width: int) -> list[torch.Tensor]:
    """Per row b, a fresh copy of ``x[b, :, starts[b]:starts[b] + width]`` (dim 2 is time): a
    request's carried state, which must not keep the batch's tensor alive. Rows with the same
    start are cut as one block and copied out with one multi-tensor copy (one kernel launch on
    CUDA, however many rows) rather than one clone each."""
    out: list[torch.Tensor] = [None] * len(starts)  # type: ignore[list-item]
    for n in dict.fromkeys(starts):
        rows = [b for b, start in enumerate(starts) if start == n]
        block = x[rows[0]:rows[-1] + 1, :, n:n + width].contiguous()  # dense: the fast path
        src = [block[b - rows[0]] for b in rows]
        dst = [torch.empty_like(t) for t in src]
        torch._foreach_copy_(dst, src)
        for b, t in zip(rows, dst):
            out[b] = t
    return out


# PyTorch runs a batch-1 float32 CPU conv on THNN instead of oneDNN when C_in * length <= 20480
# (`ConvParams::use_mkldnn` in ATen/native/Convolution.cpp). A one-shot decode of more than a few
# frames is above that at nearly every layer, so its convs run on oneDNN; a small streaming chunk
# would fall to THNN and round differently. A zero second row keeps it on oneDNN, for a negligible
# cost since only small inputs get one. This narrows float noise; it is not needed for exactness.
_THNN_MAX_NUMEL = 20480


def _on_long_input_backend(conv, x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or x.shape[0] != 1 or x.shape[1] * x.shape[2] > _THNN_MAX_NUMEL:
        return conv(x)
    return conv(torch.cat([x, torch.zeros_like(x)]))[:1]


RESIDUAL_BRANCH_GAIN = 0.2  # test weights: damp the 12 residual units so the signal stays O(1)


def reinit_code2wav_for_testing(model: Qwen3OmniMoeCode2Wav, seed: int = 0) -> Qwen3OmniMoeCode2Wav:
    """Gives a random-init code2wav audible, non-degenerate weights (its defaults peak near 1e-7).

    For tests and benchmarks only: fan-in-scaled convs and linears, unit-variance code embeddings,
    ConvNeXt layer scale 0.5 (1e-6 by default, which disables the block), the transformer's layer
    scales left at the config's 0.01, damped decoder residual branches, and the final conv
    rescaled so the waveform peaks near 0.5 on random codes (mostly unclamped).
    """
    gen = torch.Generator().manual_seed(seed)

    def normal_(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std)

    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.Embedding):
                normal_(mod.weight, 1.0)
            elif isinstance(mod, nn.ConvTranspose1d):  # [C_in, C_out, k]: each output sums k/s taps
                normal_(mod.weight, (mod.in_channels * mod.kernel_size[0] / mod.stride[0]) ** -0.5)
            elif isinstance(mod, (nn.Conv1d, nn.Linear)):
                normal_(mod.weight, mod.weight[0].numel() ** -0.5)
            elif isinstance(mod, Qwen3OmniMoeSnakeBeta):
                normal_(mod.alpha, 0.1)
                normal_(mod.beta, 0.1)
            elif isinstance(mod, Qwen3OmniMoeConvNeXtBlock):
                mod.gamma.fill_(0.5)
            if isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)) and mod.bias is not None:
                normal_(mod.bias, 0.01)
        for mod in model.modules():
            if isinstance(mod, Qwen3OmniMoeCode2WavDecoderResidualUnit):
                mod.conv2.conv.weight.mul_(RESIDUAL_BRANCH_GAIN)
        # Rescale the last conv from the waveform's peak before clamp(-1, 1).
        codes = torch.randint(0, model.config.codebook_size, (1, model.config.num_quantizers, 12), generator=gen)
        last = model.decoder[-1].conv
        peaks = []
        handle = last.register_forward_hook(lambda m, i, o: peaks.append(o.abs().max().item()))
        try:
            model(codes)
        finally:
            handle.remove()
        gain = 0.5 / max(peaks[0], 1e-12)
        last.weight.mul_(gain)
        if last.bias is not None:
            last.bias.mul_(gain)
    return model
