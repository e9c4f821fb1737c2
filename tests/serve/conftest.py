"""One Serve instance for the Serve tests: the app in async_chunk (/async) and sync (/sync)."""

from __future__ import annotations

import pytest

# Shared helper modules (not test files): their asserts explain themselves too.
pytest.register_assert_rewrite("kv_helpers", "chat_helpers", "media_helpers")

from serve_helpers import app_args, wait_ready  # noqa: E402


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


@pytest.fixture(scope="module")
def serve_port(ray_cluster, get_free_port):
    """Serve's HTTP port: the session's when another module started Serve, else this module's
    own, shut down afterwards (a later module's ``serve.start`` would not get its port)."""
    from ray import serve
    from ray.serve.context import _get_global_client

    started = _get_global_client(raise_if_no_controller_running=False) is None
    if started:
        serve.start(http_options={"host": "127.0.0.1", "port": get_free_port()})
    yield _get_global_client().http_config.port
    if started:
        serve.shutdown()
