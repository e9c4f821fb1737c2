"""Command line: ``omni-ray serve``, ``omni-ray generate``, ``omni-ray speak``,
``omni-ray batch``, ``omni-ray make-tiny`` and ``omni-ray make-dummy``.

``omni-ray serve [MODEL]`` runs the Serve app (``build_omni_app``) until Ctrl-C; ``--config FILE``
reads a Serve config's args and HTTP options, flags override them. ``omni-ray generate --text
"Hi"`` runs the same pipeline in this process (``Omni``) and prints the answer; ``--json`` prints
one JSON object instead, ``--out x.wav|.flac|.ogg|.mp3|.npy`` writes the audio. ``omni-ray speak
--text "..." --out x.mp3`` voices exactly the text offline (as ``/v1/audio/speech``) into the API's
format the suffix names. Without a model they use the embedded default, the seeded tiny checkpoint (random weights) in
``$OMNI_RAY_HOME/qwen3-omni-tiny``, made on first use. A model may be a hub id
(``Qwen/Qwen3-Omni-30B-A3B-Instruct``). ``make-dummy DIR`` writes a stand-in checkpoint without
weights (random weights at load). ``omni-ray batch --input rows.jsonl --output DIR`` answers a
file of chat rows on Ray Data into Parquet (``omni_ray/data``). Bad arguments exit with status 2.
Slow steps print a status line on stderr when it is a terminal (``--progress``: always,
``--quiet``: never).

Parsing imports neither torch, transformers nor Ray (``--help`` is instant); each subcommand
imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys

from omni_ray.cli import batch, generate, make, serve, speak


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-ray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_parser(sub)
    generate.add_parser(sub)
    speak.add_parser(sub)
    make.add_parsers(sub)
    batch.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.run(args.parser, args)  # the subcommand's parser: errors name the command


if __name__ == "__main__":
    sys.exit(main())
