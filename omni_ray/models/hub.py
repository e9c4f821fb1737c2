"""Where a ``model`` lives: a local directory, or a Hugging Face hub id fetched into its cache.

``resolve_model("Qwen/Qwen3-Omni-30B-A3B-Instruct")`` returns the snapshot directory from
``huggingface_hub.snapshot_download`` (which honours ``HF_HOME`` / ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE`` and ``HF_TOKEN``); ``revision`` picks a branch, tag or commit. An existing local
path always wins over a hub id of the same spelling. Anything else is an error naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

# owner/name as the hub spells repo ids (no leading ./ or /, exactly one slash)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_id(model: str) -> bool:
    """Whether ``model`` reads as ``owner/name`` and is not an existing local path."""
    return bool(_HUB_ID.match(model)) and not Path(model).exists()


def resolve_model(model: str, revision: str | None = None) -> str:
    """A local checkpoint directory for ``model`` (a path, or a hub id downloaded or found in
    the cache). Raises FileNotFoundError naming ``model`` when it is neither."""
    if not is_hub_id(model):
        if not Path(model).exists():
            raise FileNotFoundError(f"model: no checkpoint directory at {model!r} (and not a "
                                    f"Hugging Face hub id like 'Qwen/Qwen3-Omni-30B-A3B-Instruct')")
        return model
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(model, revision=revision)
    except LocalEntryNotFoundError as e:  # offline (HF_HUB_OFFLINE=1) and not in the cache
        raise FileNotFoundError(f"model: {model!r} (revision {revision or 'main'}) is not in the "
                                f"Hugging Face cache and downloading is off or failed: {e}") from e
