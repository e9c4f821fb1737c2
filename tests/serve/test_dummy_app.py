"""Serving a dummy checkpoint (``omni-ray make-dummy``, random weights) with
``allow_dummy_weights: true``: /v1/models says so, chat completions answer with text and audio."""

from __future__ import annotations

import base64
import io
import wave

import httpx
import pytest
from openai import OpenAI
from serve_helpers import MODEL, app_args, wait_ready

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dummy_url(serve_base_url, tmp_path_factory):
    from ray import serve

    from omni_ray import build_omni_app
    from omni_ray.models.dummy import make_dummy_checkpoint

    d = make_dummy_checkpoint(tmp_path_factory.mktemp("dummy") / "ckpt", shape="smoke", seed=0)
    serve.run(build_omni_app(app_args(str(d), "async_chunk", allow_dummy_weights=True)),
              name="omni-dummy", route_prefix="/dummy")
    yield wait_ready(f"{serve_base_url}/dummy")
    serve.delete("omni-dummy")


def test_dummy_app_says_so_and_answers(dummy_url):
    models = httpx.get(f"{dummy_url}/v1/models", timeout=30).json()["data"]
    assert models[0]["id"] == MODEL
    assert models[0]["omni_ray"] == {"dummy_weights": True, "shape": "smoke", "seed": 0}
    c = OpenAI(base_url=f"{dummy_url}/v1", api_key="none", max_retries=0, timeout=120)
    r = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"}, max_tokens=6,
        extra_body={"max_audio_frames": 10})
    msg = r.choices[0].message
    assert msg.content and r.usage.completion_tokens_details.text_tokens == 6
    with wave.open(io.BytesIO(base64.b64decode(msg.audio.data))) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 0


def test_dummy_app_is_refused_without_the_flag(tmp_path):
    from omni_ray import build_omni_app
    from omni_ray.models.dummy import make_dummy_checkpoint

    d = make_dummy_checkpoint(tmp_path / "ckpt", shape="smoke", processor=False)
    with pytest.raises(ValueError, match="allow_dummy_weights"):
        build_omni_app(app_args(str(d), "async_chunk"))
