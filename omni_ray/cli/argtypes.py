"""argparse value types of the CLI (torch-free: parsing must stay fast)."""

from __future__ import annotations

import argparse

MODALITIES = ("text", "audio")


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def port(value: str) -> int:
    n = positive_int(value)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"expected a port 1-65535, got {n}")
    return n


def token_ids(value: str) -> list[int]:
    try:
        ids = [int(t) for t in value.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids like 1,2,3, got {value!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative token ids, got {value!r}")
    return ids


def modalities(value: str) -> tuple[str, ...]:
    mods = tuple(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    bad = [m for m in mods if m not in MODALITIES]
    if not mods or bad:
        raise argparse.ArgumentTypeError(f"expected 'text' or 'text,audio', got {value!r}")
    return mods
