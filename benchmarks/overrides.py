"""A/B variants of an app's args: ``NAME:a.b=v,c=w`` -> dotted overrides, set on a copy.

gpu_check's ``--ab`` and serve_bench's ``--ab`` read variants the same way (values as YAML:
``true``, ``1``, ``0.5``, ``'1'`` for a string).
"""

from __future__ import annotations

import argparse
import copy

import yaml


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME:a.b=v,c=w`` -> (NAME, {"a.b": v, ...}); an argparse type (its error when
    malformed)."""
    name, _, body = text.partition(":")
    pairs = [kv.split("=", 1) for kv in body.split(",")] if body else []
    if not name or not pairs or any(len(kv) != 2 or not kv[0] for kv in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME:key.path=value[,...]")
    return name, {k.strip(): yaml.safe_load(v) for k, v in pairs}


def set_dotted(args: dict, overrides: dict) -> dict:
    """A copy of ``args`` with each dotted path of ``overrides`` set (parents made as needed)."""
    args = copy.deepcopy(args)
    for path, value in overrides.items():
        node = args
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return args
