"""Voices: the talker's speaker id map in the checkpoint's config, matched case-insensitively.

One function resolves a requested voice for the CLI and the HTTP API (``audio.voice``), so
``--speaker Ethan`` and ``"voice": "Ethan"`` mean the same as ``ethan``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def checkpoint_speakers(model_dir: str | os.PathLike) -> list[str]:
    """Lower-cased voice names of ``model_dir``'s talker (``talker_config.speaker_id``), sorted;
    read from config.json without transformers."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return sorted(k.lower() for k in cfg.get("talker_config", {}).get("speaker_id", {}))


def resolve_speaker(name: str, speakers: list[str]) -> str:
    """``name`` as the talker knows it (lower case); ValueError naming the choices if unknown."""
    voice = name.strip().lower()
    if voice not in speakers:
        raise ValueError(f"unknown voice {name!r}; available: {', '.join(speakers)}")
    return voice
