"""Every ``OMNI_RAY_*`` environment variable, read once, here and nowhere else.

* ``OMNI_RAY_HOME``: where omni_ray keeps its files (default ``~/.cache/omni_ray``); the CLI's
  default model, the tiny checkpoint, lives in ``$OMNI_RAY_HOME/qwen3-omni-tiny``.
"""

from __future__ import annotations

import os
from pathlib import Path

OMNI_RAY_HOME: Path = Path(os.environ.get("OMNI_RAY_HOME") or "~/.cache/omni_ray").expanduser()

# Directory name of the embedded default model (the seeded tiny checkpoint) under OMNI_RAY_HOME.
TINY_MODEL_NAME = "qwen3-omni-tiny"


def default_model_dir() -> Path:
    """Where the default model lives: ``$OMNI_RAY_HOME/qwen3-omni-tiny`` (made on first use)."""
    return OMNI_RAY_HOME / TINY_MODEL_NAME
