"""omni_ray: serving omni models (text/audio in, text + speech out) on Ray Serve.

Public names are loaded lazily: importing ``omni_ray`` (or ``omni_ray.payload``) imports neither
torch, Ray nor the other layers, and Serve loads ``omni_ray:build_omni_app`` by path.
"""

from importlib import import_module

_EXPORTS = {
    "Omni": "omni_ray.offline",
    "OmniOutput": "omni_ray.offline",
    "OmniRequest": "omni_ray.config.request",
    "OmniServingArgs": "omni_ray.config.serving",
    "PipelineConfig": "omni_ray.config.pipeline",
    "SamplingParams": "omni_ray.config.sampling",
    "StageConfig": "omni_ray.config.serving",
    "build_omni_app": "omni_ray.builders.app",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'omni_ray' has no attribute {name!r}")
