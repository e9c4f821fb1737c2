"""Build a stage's runner for the configured backend (the one place that names the backends)."""

from __future__ import annotations

from pathlib import Path

THINKER_BACKENDS = ("transformers", "vllm")
TALKER_BACKENDS = ("transformers", "vllm")
# vLLM defaults for device "cpu" (engine_kwargs override them): a fixed, small KV cache (vLLM
# would otherwise reserve gpu_memory_utilization x host memory) and eager mode (torch.compile on
# CPU adds an inductor build to the engine start).
_CPU_ENGINE_DEFAULTS = {"kv_cache_memory_bytes": 512 << 20, "enforce_eager": True}


def make_thinker_runner(backend: str, model_dir: str | Path, device: str = "cpu", dtype=None,
                        max_num_seqs: int = 64, engine_kwargs: dict | None = None,
                        kv_transfer: bool = False):
    """A ``ThinkerRunner`` (transformers) or a ``VllmThinkerRunner`` (vLLM) for ``model_dir``.

    ``engine_kwargs`` go to vLLM's ``EngineArgs``; they are an error with the transformers backend.
    ``kv_transfer``: a vLLM engine with omni_ray's KV connector (prefill/decode disaggregation);
    the transformers runner always can.
    """
    if backend not in THINKER_BACKENDS:
        raise ValueError(
            f"thinker_backend must be one of {list(THINKER_BACKENDS)}, got {backend!r}")
    if backend == "transformers":
        if engine_kwargs:
            raise ValueError("thinker_engine_kwargs apply to the vllm thinker_backend only, "
                             f"got {sorted(engine_kwargs)} with 'transformers'")
        from omni_ray.models.loading import load_stage
        from omni_ray.runners.transformers.thinker import ThinkerRunner

        th = load_stage(model_dir, "thinker", device, dtype)
        return ThinkerRunner(th.module, eos_token_ids=[th.config.im_end_token_id],
                             max_num_seqs=max_num_seqs, device=device,
                             accept_hidden_layer=th.config.talker_config.accept_hidden_layer)

    from omni_ray.runners.vllm.thinker import VllmThinkerRunner

    kwargs = dict(_CPU_ENGINE_DEFAULTS) if device == "cpu" else {}
    kwargs.update(engine_kwargs or {})
    _dummy_weights(model_dir, kwargs)
    return VllmThinkerRunner(model_dir, dtype=_dtype_name(dtype), max_num_seqs=max_num_seqs,
                             kv_transfer=kv_transfer, engine_kwargs=kwargs)


def make_talker_runner(backend: str, model_dir: str | Path, device: str = "cpu", dtype=None,
                       max_num_seqs: int = 64, engine_kwargs: dict | None = None):
    """A ``TalkerRunner`` (transformers backbone) or a ``VllmTalkerRunner`` (vLLM backbone; the
    code predictor and projections stay in transformers) for ``model_dir``."""
    if backend not in TALKER_BACKENDS:
        raise ValueError(
            f"talker_backend must be one of {list(TALKER_BACKENDS)}, got {backend!r}")
    from omni_ray.models.loading import load_stage

    if backend == "transformers" and engine_kwargs:
        raise ValueError("talker_engine_kwargs apply to the vllm talker_backend only, "
                         f"got {sorted(engine_kwargs)} with 'transformers'")
    tk = load_stage(model_dir, "talker", device, dtype)
    if backend == "transformers":
        from omni_ray.runners.transformers.talker import TalkerRunner

        return TalkerRunner(tk.module, tk.text_embedding, tk.config, max_num_seqs=max_num_seqs,
                            device=device)
    from omni_ray.runners.vllm.talker import VllmTalkerRunner

    kwargs = dict(_CPU_ENGINE_DEFAULTS, kv_cache_memory_bytes=256 << 20) if device == "cpu" else {}
    kwargs.update(engine_kwargs or {})
    _dummy_weights(model_dir, kwargs)
    return VllmTalkerRunner(model_dir, tk.module, tk.text_embedding, tk.config,
                            dtype=_dtype_name(dtype), device=device, max_num_seqs=max_num_seqs,
                            engine_kwargs=kwargs)


def _dummy_weights(model_dir, kwargs: dict) -> dict:
    """``load_format: "dummy"`` (vLLM's random weights) for a dummy checkpoint, which has no
    weight files, unless the engine kwargs already choose a load format."""
    from omni_ray.models.dummy import is_dummy_checkpoint

    if is_dummy_checkpoint(model_dir):
        kwargs.setdefault("load_format", "dummy")
    return kwargs


def _dtype_name(dtype) -> str:
    """torch.float32 / "float32" / None -> "float32" (vLLM's spelling)."""
    if dtype is None:
        return "float32"
    return str(dtype).removeprefix("torch.")
