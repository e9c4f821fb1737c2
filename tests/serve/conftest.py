"""One Serve instance for the Serve tests: the app in async_chunk (/async) and sync (/sync)."""

from __future__ import annotations

import pytest
from serve_helpers import app_args, wait_ready


@pytest.fixture(scope="session")
def serve_urls(serve_base_url, tiny_model_dir):
    """{"async_chunk": base_url, "sync": base_url} of the running apps."""
    from ray import serve

    from omni_ray import build_omni_app

    urls = {}
    for mode, prefix in (("async_chunk", "/async"), ("sync", "/sync")):
        serve.run(build_omni_app(app_args(tiny_model_dir, mode)), name=f"omni-{mode}",
                  route_prefix=prefix)
        urls[mode] = wait_ready(f"{serve_base_url}{prefix}")
    yield urls


@pytest.fixture(scope="session")
def offline(tiny_model_dir):
    """Offline pipelines (the reference for HTTP answers), one per mode."""
    from omni_ray.offline import Omni

    return {m: Omni(tiny_model_dir, mode=m) for m in ("async_chunk", "sync")}
