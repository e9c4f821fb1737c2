"""Shared fixtures: the tiny checkpoint (made once per session) and one local Ray cluster."""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per process: on 2 shared cores, oversubscription slows CPU tests ~10x.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Shared 2-core CI machines run near their memory limit; Ray's monitor would kill test workers.
os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")


def pytest_configure(config):
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen3-Omni checkpoint (seed 0), shared by the whole session."""
    from omni_ray.models.tiny import ensure_tiny_checkpoint

    cached = os.environ.get("OMNI_RAY_TEST_MODEL_DIR")
    path = cached or str(tmp_path_factory.mktemp("tiny") / "qwen3-omni-tiny")
    return str(ensure_tiny_checkpoint(path, seed=0))


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir):
    """transformers' Qwen3OmniMoeForConditionalGeneration on the tiny checkpoint (the oracle)."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_model_dir, local_files_only=True, dtype=torch.float32).eval()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def get_free_port():
    """A function returning a free TCP port on 127.0.0.1."""
    return free_port


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the session (ray.shutdown also ends Serve)."""
    import ray

    os.environ.setdefault("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=256 << 20, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def serve_base_url(ray_cluster, get_free_port) -> str:
    """Serve started once on a free port; apps add their own route prefix to this URL (one Serve
    per cluster: a second ``serve.start`` with other HTTP options would be ignored)."""
    from ray import serve

    port = get_free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return f"http://127.0.0.1:{port}"
