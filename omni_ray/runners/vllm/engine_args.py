"""The ``EngineArgs`` keywords of a vLLM stage: our CPU defaults, ``max_model_len``, then the
stage config's ``engine_kwargs`` over them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_ray.config.serving import StageConfig

# vLLM defaults for device "cpu" (engine_kwargs override them): a fixed, small KV cache (vLLM
# would otherwise reserve gpu_memory_utilization x host memory) and eager mode (torch.compile on
# CPU adds an inductor build to the engine start).
CPU_ENGINE_DEFAULTS: dict[str, Any] = {"kv_cache_memory_bytes": 512 << 20, "enforce_eager": True}


def engine_kwargs(model_dir: str | Path, stage_cfg: StageConfig, max_model_len: int | None = None,
                  cpu_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cpu_defaults`` (``CPU_ENGINE_DEFAULTS`` unless given) on CPU, ``max_model_len`` when
    given, the stage's ``engine_kwargs`` over both; ``load_format: "dummy"`` (vLLM's random
    weights) for a dummy checkpoint, which has no weight files, unless a load format is set."""
    from omni_ray.models.dummy import is_dummy_checkpoint

    kwargs: dict[str, Any] = {}
    if stage_cfg.device == "cpu":
        kwargs.update(CPU_ENGINE_DEFAULTS if cpu_defaults is None else cpu_defaults)
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    kwargs.update(stage_cfg.engine_kwargs)
    if is_dummy_checkpoint(model_dir):
        kwargs.setdefault("load_format", "dummy")
    return kwargs
