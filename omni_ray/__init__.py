"""omni_ray: serving omni models (text/audio in, text + speech out) on Ray Serve."""

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.config.sampling import SamplingParams
from omni_ray.config.serving import OmniServingArgs, StageConfig

__all__ = [
    "Omni",
    "OmniOutput",
    "OmniRequest",
    "OmniServingArgs",
    "PipelineConfig",
    "SamplingParams",
    "StageConfig",
    "build_omni_app",
]


def __getattr__(name: str):
    # Lazy: importing omni_ray must not import torch or Ray (Serve loads the builder by path).
    if name in ("Omni", "OmniOutput"):
        from omni_ray import offline

        return getattr(offline, name)
    if name == "build_omni_app":
        from omni_ray.builders.app import build_omni_app

        return build_omni_app
    raise AttributeError(name)
