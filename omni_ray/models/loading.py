"""Load one stage of a local Qwen3-Omni checkpoint (tiny or real, single file or sharded).

transformers owns the checkpoint format (it renames and fuses keys on load, e.g. per-expert MoE
weights into one tensor), so each stage loads through ``from_pretrained`` and keeps only its own
submodule; the rest is freed before the stage starts serving. The talker also keeps the thinker's
token embedding table, which it needs to project text.

A dummy checkpoint (``omni-ray make-dummy``: config, no weights; ``models/dummy.py``) builds the
stage from its config instead, with the marker's seed, directly on the device: only the stage's
module (the talker stage gets a random thinker token-embedding table, not the thinker).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STAGES = ("thinker", "talker", "code2wav")


def load_omni_config(model_dir: str | Path):
    """The checkpoint's ``Qwen3OmniMoeConfig``."""
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig.from_pretrained(str(model_dir), local_files_only=True)


@dataclass
class StageModules:
    """What one stage needs from the checkpoint."""

    config: object          # Qwen3OmniMoeConfig (the whole model's)
    module: object          # the stage's nn.Module (thinker / talker / code2wav)
    text_embedding: object  # thinker's nn.Embedding, only for the talker stage (else None)


def load_stage(model_dir: str | Path, stage: str, device: str = "cpu", dtype=None) -> StageModules:
    """Load ``stage``'s module of the checkpoint at ``model_dir`` onto ``device``."""
    import torch

    from omni_ray.models.dummy import build_dummy_stage, dummy_info

    if stage not in STAGES:
        raise ValueError(f"stage must be one of {list(STAGES)}, got {stage!r}")
    dtype = dtype or torch.float32
    info = dummy_info(model_dir)
    if info is not None:
        config = load_omni_config(model_dir)
        module, embedding = build_dummy_stage(config, stage, device, dtype, seed=info["seed"])
    else:
        config, module, embedding = _from_pretrained(model_dir, stage, device, dtype)
    if stage == "talker":
        # transformers' talker mrope index reads ``config.audio_config.n_window`` (the audio
        # encoder's), which the talker config lacks (5.24): lend it the thinker's.
        module.config.audio_config = config.thinker_config.audio_config
    return StageModules(config=config, module=module, text_embedding=embedding)


def _from_pretrained(model_dir, stage: str, device: str, dtype):
    """(config, stage module, thinker embedding for the talker) out of the real weights."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    full = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(model_dir), local_files_only=True, dtype=dtype
    ).eval()
    embedding = None
    if stage == "talker":
        embedding = full.thinker.get_input_embeddings().to(device)
    module = getattr(full, stage).to(device).eval()
    return full.config, module, embedding
