"""What ``generate`` and ``speak`` share: the checkpoint (found, fetched or made) and the offline
pipeline (``Omni``) loaded with the app's args, each a status line (``progress.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from omni_ray.cli.progress import Progress


def warnings_to_stderr() -> None:
    """Library warnings (random weights, ...) as one ``WARNING: ...`` line each; transformers'
    progress bars and config chatter off (stdout may be JSON)."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def offline_serving_args(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The app's args for an offline command: ``--config`` and the flags, its ``--mode`` and
    ``--code2wav-mode``, random weights allowed (and warned about). Bad ones exit 2."""
    from omni_ray.cli.serve_config import serving_args

    pipeline = {"mode": args.mode, "code2wav_mode": args.code2wav_mode}
    try:
        sa, _ = serving_args(args, {"pipeline": pipeline, "allow_dummy_weights": True})
    except (OSError, ValueError) as e:
        parser.error(str(e))
    return sa


def find_checkpoint(parser: argparse.ArgumentParser, sa, progress: Progress) -> str:
    """The checkpoint directory of ``sa.model``: made (``tiny``, first use) or fetched (a hub
    id) under a status line; a local directory as it is. Errors exit 2 naming the problem."""
    warnings_to_stderr()
    what = None
    if sa.model == "tiny":
        if not (Path(sa.resolved_model_dir()) / "config.json").is_file():
            what = f"making the tiny checkpoint in {sa.resolved_model_dir()} (random weights)"
    elif not Path(sa.model).is_dir():
        what = f"fetching {sa.model}"
    try:
        if what is None:
            return sa.checkpoint_dir()
        with progress.step(what):
            return sa.checkpoint_dir()
    except (OSError, ValueError) as e:
        parser.error(str(e))


def load_omni(sa, model: str, progress: Progress, *, audio: bool = True):
    """``Omni`` over ``model`` as ``sa`` says (backends, device, dtype, pipeline); only the
    thinker when ``audio`` is False."""
    import torch

    from omni_ray.offline import Omni

    stages = "thinker, talker, code2wav" if audio else "thinker"
    with progress.step(f"loading {model} ({stages}) on {sa.thinker.device}"):
        return Omni(model, mode=sa.pipeline.mode, pipeline=sa.pipeline, device=sa.thinker.device,
                    dtype=getattr(torch, sa.thinker.dtype), audio=audio,
                    thinker_backend=sa.thinker.backend,
                    thinker_engine_kwargs=sa.thinker.engine_kwargs,
                    talker_backend=sa.talker.backend,
                    talker_engine_kwargs=sa.talker.engine_kwargs)
