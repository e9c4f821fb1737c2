"""Wrap a stage's runner in its stage logic: the one place both shells do it.

The Serve engine actor calls ``build_stage_logic`` with the stage's ``StageConfig`` whole;
``Omni`` (offline.py) builds its runners with ``runners/factory.py`` from ``StageConfig``s of its
arguments and calls ``wrap_runner``. The runners are imported lazily: importing the pipeline core
loads no model code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.pipeline.code2wav import Code2WavLogic
from omni_ray.pipeline.emit import StageLogic
from omni_ray.pipeline.talker import TalkerLogic
from omni_ray.pipeline.thinker import ThinkerLogic

if TYPE_CHECKING:
    from omni_ray.config.serving import StageConfig

STAGES = ("thinker", "talker", "code2wav")  # in pipeline order


def wrap_runner(stage: str, runner, pipeline: PipelineConfig) -> StageLogic:
    """The stage logic that steps ``runner`` (the talker's reads ``runner.num_code_groups``)."""
    if stage == "thinker":
        return ThinkerLogic(runner, pipeline)
    if stage == "talker":
        return TalkerLogic(runner, pipeline, runner.num_code_groups)
    if stage == "code2wav":
        return Code2WavLogic(runner, first_chunks_first=pipeline.first_chunks_first,
                             max_batch=pipeline.code2wav_batch(runner.dtype),
                             urgent_s=pipeline.code2wav_urgent_ms / 1000)
    raise ValueError(f"unknown stage {stage!r}; expected one of {list(STAGES)}")


def build_stage_logic(stage: str, model_dir: str, stage_cfg: StageConfig,
                      pipeline: PipelineConfig, max_model_len: int = 8192,
                      kv_transfer: bool = False, warm_up: bool = True) -> StageLogic:
    """Build ``stage``'s runner from ``stage_cfg`` whole (``runners/factory.py``) and wrap it;
    ``warm_up=False``: without the runner's ``warm_up()`` (``make_runner``)."""
    from omni_ray.runners.factory import make_runner

    runner = make_runner(stage, model_dir, stage_cfg, pipeline=pipeline, kv_transfer=kv_transfer,
                         max_model_len=max_model_len, warm_up=warm_up)
    return wrap_runner(stage, runner, pipeline)
