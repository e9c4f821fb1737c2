"""Shared by the stage engine tests: a real thinker engine actor on the tiny checkpoint."""

from __future__ import annotations

import pytest
import ray

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.serving import StageConfig
from omni_ray.stages.engine import StageEngine


@pytest.fixture(scope="module")
def thinker_engine(ray_cluster, tiny_model_dir):
    """A ``StageEngine`` actor for the thinker (transformers, CPU), started and ready."""
    e = ray.remote(StageEngine).options(num_cpus=0).remote(
        "thinker", tiny_model_dir, StageConfig(), PipelineConfig())
    ray.get(e.ready.remote())
    yield e
    ray.kill(e)
