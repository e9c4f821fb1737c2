"""``omni-ray make-tiny`` / ``make-dummy``: write a random-weight checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from omni_ray.cli.progress import Progress, add_progress_flags
from omni_ray.models.dummy import DEFAULT_SHAPE, SHAPES


def add_parsers(sub) -> None:
    tiny = sub.add_parser("make-tiny", help="write the seeded tiny Qwen3-Omni checkpoint "
                          "(random weights)")
    tiny.add_argument("dir", type=Path, help="output directory (created)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    add_progress_flags(tiny)
    tiny.set_defaults(run=run_tiny, parser=tiny)

    dummy = sub.add_parser("make-dummy", help="write a Qwen3-Omni stand-in checkpoint without "
                           "weights (random weights when loaded)")
    dummy.add_argument("dir", type=Path, help="output directory (created)")
    dummy.add_argument("--shape", choices=SHAPES, default=DEFAULT_SHAPE,
                       help=f"sizes: the released model's or CPU-sized (default {DEFAULT_SHAPE})")
    dummy.add_argument("--seed", type=int, default=0, help="weight seed used at load (default 0)")
    dummy.add_argument("--no-processor", action="store_true",
                       help="no audio/image processor files (they need torchvision)")
    add_progress_flags(dummy)
    dummy.set_defaults(run=run_dummy, parser=dummy)


def run_tiny(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from omni_ray.cli.loading import warnings_to_stderr
    from omni_ray.models.tiny import make_tiny_checkpoint

    warnings_to_stderr()  # transformers' own bars and config chatter off: the status line says it
    with Progress.from_args(args).step(f"making the tiny checkpoint in {args.dir} "
                                       "(random weights)"):
        out = make_tiny_checkpoint(args.dir, seed=args.seed)
    print(out)
    return 0


def run_dummy(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from omni_ray.cli.loading import warnings_to_stderr
    from omni_ray.models.dummy import make_dummy_checkpoint

    warnings_to_stderr()
    with Progress.from_args(args).step(f"writing a {args.shape} stand-in to {args.dir} "
                                       "(random weights at load)"):
        out = make_dummy_checkpoint(args.dir, shape=args.shape, seed=args.seed,
                                    processor=not args.no_processor)
    print(out)
    return 0
