"""omni_ray.constants: OMNI_RAY_HOME is read once, at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SNIPPET = "from omni_ray import constants; print(constants.default_model_dir())"


def _default_dir(env: dict) -> str:
    return subprocess.run([sys.executable, "-c", SNIPPET], env=env, check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_default_model_dir_follows_omni_ray_home(tmp_path):
    env = dict(os.environ, OMNI_RAY_HOME=str(tmp_path))
    assert _default_dir(env) == str(tmp_path / "qwen3-omni-tiny")


def test_default_omni_ray_home_is_the_user_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMNI_RAY_HOME"}
    env["HOME"] = str(tmp_path)
    assert _default_dir(env) == str(Path(tmp_path) / ".cache/omni_ray/qwen3-omni-tiny")
