"""Forward passes at prefill sizes right after a vLLM engine starts, before it takes requests.

vLLM compiles its Triton kernels the first time it meets a shape: its start-up runs one
profiling forward at ``max_num_batched_tokens`` tokens and captures decode batches of up to 512,
so a prefill of another size (8 or 32 prompts arriving at once) still JIT-compiles the fused MoE
kernel for its block configuration and Triton's specialisation of its sizes (divisible by 16 or
not) in the middle of serving. On one H200 that was a 1.3 s stall of the talker for the first
burst of 8 requests (vLLM's own JIT monitor: "Triton kernel JIT compilation during inference:
fused_moe_kernel ... consider extending warmup"). ``warm_kernels`` runs a dummy forward at each
size in ``prefill_sizes`` (every fused-MoE configuration bucket, even and odd) on the engine's
workers, through vLLM's ``collective_rpc``, so those compiles happen at start.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

# The token counts vLLM's tuned fused-MoE configurations are keyed by (configs/E=...json).
_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192, 16384)


def prefill_sizes(max_tokens: int) -> list[int]:
    """Each configuration bucket up to ``max_tokens``, and one more token (Triton specialises
    sizes divisible by 16 apart), and ``max_tokens`` itself."""
    sizes = {n + extra for n in _BUCKETS for extra in (0, 1) if n + extra <= max_tokens}
    return sorted(sizes | {max_tokens})


def _dummy_forwards(worker, sizes: list[int]) -> int:
    """On a vLLM worker: one eager (no CUDA graph) dummy forward per size."""
    import torch
    from vllm.config import CUDAGraphMode

    for n in sizes:
        worker.model_runner._dummy_run(n, cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                       skip_eplb=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return len(sizes)


def warm_kernels(engine, stage: str) -> float | None:
    """Run ``prefill_sizes`` dummy forwards on ``engine``'s (an ``LLMEngine``) workers; the
    seconds it took, or None when it failed (logged: a warm-up is worth start time, not the
    stage)."""
    sizes = prefill_sizes(engine.vllm_config.scheduler_config.max_num_batched_tokens)
    t = time.perf_counter()
    try:
        engine.collective_rpc(_dummy_forwards, args=(sizes,))
    except Exception as e:  # noqa: BLE001
        logger.warning("%s: kernel warm-up failed (%s: %s); shapes compile on first use",
                       stage, type(e).__name__, e)
        return None
    seconds = time.perf_counter() - t
    logger.info("%s: kernel warm-up, %d prefill sizes up to %d tokens, in %.1f s", stage,
                len(sizes), sizes[-1], seconds)
    return seconds


def warm_kernels_on_gpu(engine, stage: str) -> float | None:
    """``warm_kernels`` where the engine runs on a GPU (vLLM's platform); None elsewhere (CPU
    kernels are not JIT-compiled per shape)."""
    from vllm.platforms import current_platform

    return warm_kernels(engine, stage) if current_platform.is_cuda_alike() else None
