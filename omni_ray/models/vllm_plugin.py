"""omni_ray's vLLM plugin: registers the talker model and the thinker with the
hidden-state copy (entry point ``vllm.general_plugins``).

vLLM calls ``register`` in every process that builds or runs an engine (pyproject.toml names it
under ``[project.entry-points."vllm.general_plugins"]``); ``VllmTalkerRunner`` also calls it
before it starts an engine, so a checkout on ``PYTHONPATH`` without installed entry points works
too. Idempotent; imports nothing of vLLM's model code until vLLM needs the class.
"""

from __future__ import annotations

TALKER_ARCHITECTURE = "OmniRayQwen3OmniTalkerForCausalLM"
THINKER_ARCHITECTURE = "OmniRayQwen3OmniThinkerForConditionalGeneration"
_MODELS = {
    TALKER_ARCHITECTURE: "omni_ray.models.vllm_talker:OmniRayQwen3OmniTalkerForCausalLM",
    THINKER_ARCHITECTURE: "omni_ray.models.vllm_thinker:"
                          "OmniRayQwen3OmniThinkerForConditionalGeneration",
}


def register() -> None:
    from vllm import ModelRegistry

    for arch, path in _MODELS.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, path)
