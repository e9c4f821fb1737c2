"""One Serve instance for the Serve tests: the app in async_chunk (/async) and sync (/sync)."""

from __future__ import annotations

import pytest


def app_args(model_dir: str, mode: str, **over) -> dict:
    args = {
        "model": model_dir,
        "model_id": "qwen3-omni",
        "pipeline": {"mode": mode},
        "limits": {"max_prompt_tokens": 512, "default_max_audio_frames": 60},
        "security": {"enable_debug_endpoints": True, "allow_fault_injection": True},
    }
    args.update(over)
    return args


@pytest.fixture(scope="session")
def serve_urls(ray_cluster, tiny_model_dir, get_free_port):
    """{"async_chunk": base_url, "sync": base_url} of the running apps."""
    from ray import serve

    from omni_ray import build_omni_app

    port = get_free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    urls = {}
    for mode, prefix in (("async_chunk", "/async"), ("sync", "/sync")):
        serve.run(build_omni_app(app_args(tiny_model_dir, mode)), name=f"omni-{mode}",
                  route_prefix=prefix)
        urls[mode] = f"http://127.0.0.1:{port}{prefix}"
    yield urls


@pytest.fixture(scope="session")
def offline(tiny_model_dir):
    """Offline pipelines (the reference for HTTP answers), one per mode."""
    from omni_ray.offline import Omni

    return {m: Omni(tiny_model_dir, mode=m) for m in ("async_chunk", "sync")}
