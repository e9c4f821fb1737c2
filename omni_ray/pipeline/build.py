"""Build a stage's runner and wrap it in its stage logic: the one place both shells do it.

``Omni`` (offline.py) calls ``make_runner`` with its arguments; the Serve engine actor calls
``build_stage_logic`` with the stage's ``StageConfig`` whole. Model loading is imported lazily:
importing the pipeline core loads no model code.
"""

from __future__ import annotations

from pathlib import Path

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.pipeline.code2wav import Code2WavLogic
from omni_ray.pipeline.emit import StageLogic
from omni_ray.pipeline.talker import TalkerLogic
from omni_ray.pipeline.thinker import ThinkerLogic

STAGES = ("thinker", "talker", "code2wav")  # in pipeline order


def make_runner(stage: str, model_dir: str | Path, *, pipeline: PipelineConfig,
                backend: str = "transformers", device: str = "cpu", dtype=None,
                max_num_seqs: int = 64, engine_kwargs: dict | None = None,
                kv_transfer: bool = False):
    """The runner of ``stage`` for ``model_dir`` (``dtype`` a torch dtype; the backend and
    ``engine_kwargs`` apply to the thinker and the talker; ``pipeline`` to code2wav)."""
    from omni_ray.runners.factory import make_talker_runner, make_thinker_runner

    if stage == "thinker":
        return make_thinker_runner(backend, model_dir, device, dtype, max_num_seqs,
                                   engine_kwargs, kv_transfer)
    if stage == "talker":
        return make_talker_runner(backend, model_dir, device, dtype, max_num_seqs, engine_kwargs)
    if stage == "code2wav":
        from omni_ray.models.loading import load_stage
        from omni_ray.runners.transformers.code2wav import Code2WavRunner

        m = load_stage(model_dir, "code2wav", device, dtype)
        return Code2WavRunner(m.module, mode=pipeline.code2wav_mode,
                              left_context_frames=pipeline.left_context_frames, device=device)
    raise ValueError(f"unknown stage {stage!r}; expected one of {list(STAGES)}")


def wrap_runner(stage: str, runner, pipeline: PipelineConfig) -> StageLogic:
    """The stage logic that steps ``runner`` (the talker's reads ``runner.num_code_groups``)."""
    if stage == "thinker":
        return ThinkerLogic(runner, pipeline)
    if stage == "talker":
        return TalkerLogic(runner, pipeline, runner.num_code_groups)
    if stage == "code2wav":
        return Code2WavLogic(runner)
    raise ValueError(f"unknown stage {stage!r}; expected one of {list(STAGES)}")


def build_stage_logic(stage: str, model_dir: str, stage_cfg, pipeline: PipelineConfig,
                      max_model_len: int = 8192, kv_transfer: bool = False) -> StageLogic:
    """Load ``stage``'s model as ``stage_cfg`` (a ``StageConfig``) says and wrap its runner."""
    import torch

    engine_kwargs = None
    if stage_cfg.backend == "vllm" and stage in ("thinker", "talker"):
        engine_kwargs = {"max_model_len": max_model_len, **stage_cfg.engine_kwargs}
    runner = make_runner(stage, model_dir, pipeline=pipeline, backend=stage_cfg.backend,
                         device=stage_cfg.device, dtype=getattr(torch, stage_cfg.dtype),
                         max_num_seqs=stage_cfg.max_num_seqs, engine_kwargs=engine_kwargs,
                         kv_transfer=kv_transfer)
    return wrap_runner(stage, runner, pipeline)
