"""``omni-ray batch --input rows.jsonl|.parquet --output DIR``: a batch job on Ray Data.

Each input row (OpenAI's chat shape: ``id``, ``messages``, optional ``voice``, ``max_tokens``,
``max_audio_frames``, ``modalities``) becomes one output row in ``DIR/*.parquet`` (``id``,
``text``, ``text_token_ids``, ``audio``, ``error``, ...; ``omni_ray/data/__init__.py``), written as
blocks finish; run again after a crash, it skips the rows already written. ``--config FILE`` (a
Serve config) and the model flags choose the checkpoint and engines as for ``omni-ray serve``.
Ray Data shows its progress bars on stderr; the summary is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omni_ray.cli.argtypes import positive_int
from omni_ray.cli.serve_config import add_app_flags, serving_args

AUDIO_FORMATS = ("flac", "wav", "mp3", "opus", "aac", "pcm16", "float32")


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="answer a JSONL/Parquet file of chat rows into Parquet "
                                     "(Ray Data; restartable)")
    p.add_argument("--input", type=Path, required=True, metavar="FILE",
                   help="rows.jsonl, or a .parquet file / directory with an id column")
    p.add_argument("--output", type=Path, required=True, metavar="DIR",
                   help="Parquet directory; rows whose id is already there are skipped")
    add_app_flags(p, model=True)
    p.add_argument("--batch-size", type=positive_int, default=16, help="rows per stage step")
    p.add_argument("--concurrency", type=positive_int, default=1, help="actors per stage")
    p.add_argument("--audio-format", choices=AUDIO_FORMATS, default="flac",
                   help="the audio column: encoded bytes, or float32 samples")
    p.add_argument("--text-only", action="store_true",
                   help="no talker or code2wav (rows asking for audio get an error)")
    p.add_argument("--rows-per-file", type=positive_int, default=None,
                   help="at most this many rows per Parquet file")
    p.set_defaults(run=run, parser=p)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from omni_ray.cli.loading import warnings_to_stderr
    from omni_ray.data.config import from_serving_args

    warnings_to_stderr()
    if not args.input.exists():
        parser.error(f"--input: no such file {str(args.input)!r}")
    try:
        sa, _ = serving_args(args)
        cfg = from_serving_args(sa, batch_size=args.batch_size, concurrency=args.concurrency,
                                audio_format=args.audio_format, audio=not args.text_only)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    import ray

    from omni_ray.data.job import run_batch_job

    ray.init(ignore_reinit_error=True, log_to_driver=False)
    try:
        summary = run_batch_job(args.input, args.output, cfg, rows_per_file=args.rows_per_file)
    except (OSError, ValueError) as e:
        print(f"omni-ray batch: {e}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    print(json.dumps(summary), flush=True)
    return 0
