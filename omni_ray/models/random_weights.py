"""Whether a checkpoint holds random weights, in one line a person can read.

Two kinds do: the seeded tiny checkpoint (``omni-ray make-tiny``, the embedded default; marker
``omni_ray_tiny.json``) and the ``omni-ray make-dummy`` stand-in (marker ``omni_ray_dummy.json``).
Whoever loads or serves one prints ``random_weights_warning``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omni_ray.models.dummy import dummy_info
from omni_ray.models.tiny import TINY_MARKER

TINY_HIDDEN = 32  # tiny_config_dict's default width


def random_weights_warning(model_dir: str | os.PathLike) -> str | None:
    """``"WARNING: ..."`` (one line) when ``model_dir`` has random weights, else None."""
    info = dummy_info(model_dir)
    if info is not None:
        return (f"WARNING: {model_dir} is an omni-ray make-dummy stand-in (shape "
                f"{info.get('shape')}): RANDOM weights, its text and speech are noise")
    if (Path(model_dir) / TINY_MARKER).is_file() or _tiny_sized(model_dir):
        return (f"WARNING: {model_dir} is the tiny test checkpoint: RANDOM weights, its text and "
                f"speech are noise (give a real model, e.g. Qwen/Qwen3-Omni-30B-A3B-Instruct)")
    return None


def _tiny_sized(model_dir: str | os.PathLike) -> bool:
    """A tiny checkpoint made before the marker: its thinker is 32 wide (no trained model is)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        return cfg["thinker_config"]["text_config"]["hidden_size"] <= TINY_HIDDEN
    except (OSError, ValueError, KeyError, TypeError):
        return False
