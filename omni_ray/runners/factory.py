"""Pick a stage's runner class for its backend and build it from the ``StageConfig`` whole (the one
place that names the backends; each runner's ``from_config`` reads what it needs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.serving import StageConfig

BACKENDS = {"thinker": ("transformers", "vllm"), "talker": ("transformers", "vllm"),
            "code2wav": ("transformers",)}


def runner_class(stage: str, backend: str) -> Any:
    """The runner class of ``stage`` on ``backend``; imported here, so importing this module loads
    no backend."""
    check_backend(stage, backend)
    if stage == "thinker" and backend == "vllm":
        from omni_ray.runners.vllm.thinker import VllmThinkerRunner
        return VllmThinkerRunner
    if stage == "thinker":
        from omni_ray.runners.transformers.thinker import ThinkerRunner
        return ThinkerRunner
    if stage == "talker" and backend == "vllm":
        from omni_ray.runners.vllm.talker import VllmTalkerRunner
        return VllmTalkerRunner
    if stage == "talker":
        from omni_ray.runners.transformers.talker import TalkerRunner
        return TalkerRunner
    from omni_ray.runners.transformers.code2wav import Code2WavRunner
    return Code2WavRunner


def make_runner(stage: str, model_dir: str | Path, stage_cfg: StageConfig, *,
                pipeline: PipelineConfig, kv_transfer: bool = False,
                max_model_len: int | None = None, warm_up: bool = True):
    """``stage``'s runner for ``model_dir`` as ``stage_cfg`` says (its backend, device, dtype,
    ``max_num_seqs``, vLLM ``engine_kwargs``). ``kv_transfer``: a thinker that hands its KV over
    (prefill/decode disaggregation); ``max_model_len``: vLLM's, under ``engine_kwargs``.
    ``warm_up=False``: the runner's ``warm_up()`` (graph captures that only add to its own
    memory) is left to the caller, which runs it after its GPU start turn (stages/engine.py)."""
    cls = runner_class(stage, stage_cfg.backend)
    runner = cls.from_config(model_dir, stage_cfg, pipeline=pipeline, kv_transfer=kv_transfer,
                             max_model_len=max_model_len)
    if warm_up:
        warm_up_runner(runner)
    return runner


def warm_up_runner(runner) -> None:
    """The runner's own warm-up, where it has one (the talkers' code predictor graphs)."""
    if hasattr(runner, "warm_up"):
        runner.warm_up()


def stage_config(stage: str, backend: str = "transformers", *, device: str = "cpu",
                 dtype: torch.dtype | str | None = None, max_num_seqs: int = 64,
                 engine_kwargs: dict | None = None) -> StageConfig:
    """A ``StageConfig`` out of loose arguments (``Omni``, the offline CLI, tests): the backend
    checked first, ``engine_kwargs`` only with vLLM (the Serve config passes them through)."""
    from omni_ray.config.serving import StageConfig

    check_backend(stage, backend)
    if backend == "transformers" and engine_kwargs:
        raise ValueError(f"{stage}_engine_kwargs apply to the vllm {stage}_backend only, "
                         f"got {sorted(engine_kwargs)} with 'transformers'")
    return StageConfig(backend=backend, device=device, dtype=dtype_name(dtype),
                       max_num_seqs=max_num_seqs, engine_kwargs=dict(engine_kwargs or {}))


def check_backend(stage: str, backend: str) -> None:
    """``ValueError`` naming the field when ``stage`` has no ``backend``."""
    if stage not in BACKENDS:
        raise ValueError(f"unknown stage {stage!r}; expected one of {list(BACKENDS)}")
    if backend not in BACKENDS[stage]:
        raise ValueError(f"{stage}_backend must be one of {list(BACKENDS[stage])}, got {backend!r}")


def dtype_name(dtype: torch.dtype | str | None) -> str:
    """torch.float32 / "float32" / None -> "float32" (the config's and vLLM's spelling)."""
    if dtype is None:
        return "float32"
    return str(dtype).removeprefix("torch.")
