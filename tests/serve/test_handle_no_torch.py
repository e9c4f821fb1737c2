"""DeploymentHandle streams carry only plain Python / numpy values (issue 18, item 9).

A driver process that never imports torch (``handle_driver.py``) must get the text and the
audio events of a spoken answer and end without torch in ``sys.modules``. Before the fix the
audio events carried a torch tensor and such a driver waited forever after the text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import body

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("handle_driver.py")
PLAIN = {"builtins.str", "builtins.int", "builtins.bytes", "builtins.dict", "numpy.ndarray"}


def test_handle_stream_without_torch(serve_urls):
    import ray

    address = ray.get_runtime_context().gcs_address
    payload = dict(body("Say something", stream=False, max_tokens=8, frames=20))
    # A user's driver: without the test session's RAY_ENABLE_ZERO_COPY_TORCH_TENSORS, which
    # makes Ray itself import torch to register its tensor serializer.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONSTARTUP", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS")}
    proc = subprocess.run([sys.executable, str(DRIVER), address, "omni-async_chunk",
                           json.dumps(payload)], capture_output=True, text=True, timeout=180,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["kinds"][-1] == "done" and "text" in out["kinds"] and "audio" in out["kinds"], out
    assert out["text"] and out["text"] == out["done_text"]
    assert out["num_samples"] > 0 and out["samples_numpy_f32"] and out["pcm16_bytes"], out
    assert set(out["value_types"]) <= PLAIN, out["value_types"]
    assert out["torch_imported"] is False, "the driver imported torch"
