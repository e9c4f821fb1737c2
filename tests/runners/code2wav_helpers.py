"""The small random code2wav models and comparisons the streaming and graph tests share."""

from __future__ import annotations

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from benchmarks.vocoder_bench import SETUPS
from omni_ray.runners.transformers.code2wav_stream import StreamingCode2Wav, reinit_code2wav_for_testing

TOL = 1e-5  # max |stream - one-shot| / one-shot peak; see test_code2wav_stream.py's docstring
SAMPLES_PER_FRAME = 1920
WITHHELD = 555  # samples after the last frame that need the next frame

TINY = {**SETUPS["tiny"], "codebook_size": 2048, "num_quantizers": 16}  # vocoder_bench's tiny
# Two layers, grouped-query attention and a window of 4 so the window slides within a few frames.
TINY_SLIDING = {**TINY, "num_hidden_layers": 2, "num_key_value_heads": 1, "sliding_window": 4}


def build_stream(config_kwargs: dict, seed: int = 0) -> StreamingCode2Wav:
    torch.manual_seed(seed)
    model = Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig(**config_kwargs)).eval()
    return StreamingCode2Wav(reinit_code2wav_for_testing(model, seed))


def random_codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def one_shot(stream: StreamingCode2Wav, codes: torch.Tensor) -> torch.Tensor:
    return stream.model(codes.T[None]).flatten()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return ((got - want).abs().max() / want.abs().max()).item()


def decode_steps(stream: StreamingCode2Wav, codes: list[torch.Tensor], steps: list[tuple]):
    """Decode ``steps`` (per step, each request's new frames; 0: none this step) with
    ``decode_batch``; per step each live request's samples; the final states; frames decoded."""
    states, pos, outs = [stream.new_state() for _ in codes], [0] * len(codes), []
    for step in steps:
        live = [i for i, n in enumerate(step) if n]
        chunks = [codes[i][pos[i]:pos[i] + step[i]] for i in live]
        outs.append(stream.decode_batch([states[i] for i in live], chunks))
        for i in live:
            pos[i] += step[i]
    return outs, states, pos


def joined(outs, codes: list[torch.Tensor], steps: list[tuple]) -> list[torch.Tensor]:
    """``decode_steps``' samples joined per request."""
    per = [[] for _ in codes]
    for step, step_outs in zip(steps, outs):
        for i, o in zip([i for i, n in enumerate(step) if n], step_outs):
            per[i].append(o)
    return [torch.cat(p) for p in per]
