"""Engine starts take turns on each GPU.

vLLM sizes its KV cache from a memory profile taken while it starts, and it fails the start
("Error in memory profiling ... other processes sharing the same container release GPU memory")
when the GPU's free memory moves under it; another engine loading (or a failed one freeing) its
weights at the same moment does exactly that. So every stage engine that loads onto a GPU holds
that GPU's start lock from before it touches the GPU until its model is loaded and warmed up
(vLLM's profile, KV cache and CUDA graphs included). The runner's own ``warm_up()`` (the code
predictor's compiled graphs: ~100 s of a fresh talker's start) runs after the turn, beside the
next engine's start: it only adds to its process's memory, never frees any, and the engines
that follow size their KV cache by ``kv_cache_memory_bytes`` where GPUs are shared
(serve_configs/qwen3_omni_1gpu.yaml). The locks are files in the node's temp dir
(``OMNI_RAY_LOCK_DIR`` overrides it), one per physical GPU, so they work across the Ray actor
processes of a node; engines on other GPUs start in parallel. A start that fails frees its GPU
memory before it lets the next engine go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("omni_ray")


def gpu_ids(device: str) -> list[str]:
    """The physical GPU ids a stage on ``device`` uses (Ray sets CUDA_VISIBLE_DEVICES)."""
    if not device.startswith("cuda"):
        return []
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    index = int(device.partition(":")[2] or 0)
    if not visible:
        return [str(index)]
    return [visible[index]] if index < len(visible) else visible


def lock_dir() -> Path:
    return Path(os.environ.get("OMNI_RAY_LOCK_DIR") or tempfile.gettempdir())


@contextlib.contextmanager
def gpu_start_turn(device: str, stage: str):
    """Hold the start lock of every GPU ``device`` maps to (sorted: no deadlock) while the body
    loads the stage; a no-op on CPU."""
    from filelock import FileLock

    ids = sorted(set(gpu_ids(device)))
    if not ids:
        yield
        return
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        for gpu in ids:
            stack.enter_context(FileLock(str(lock_dir() / f"omni_ray_gpu{gpu}_start.lock")))
        waited = time.monotonic() - t0
        logger.info("%s: GPU %s start turn after %.1f s waiting", stage, ",".join(ids), waited)
        try:
            yield
        except BaseException:
            _free_gpu_memory()
            raise
        logger.info("%s: started on GPU %s in %.1f s", stage, ",".join(ids),
                    time.monotonic() - t0 - waited)


def _free_gpu_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
