"""A stand-in for NVIDIA's MPS control binary on machines without it (tests/test_mps.py,
tests/cli/test_serve_command.py)."""

from __future__ import annotations

from pathlib import Path


def fake_control(bin_dir: Path, calls: Path) -> None:
    """A script named like NVIDIA's MPS control binary (only GPU machines have it) that records
    how it was called: its arguments, the pipe directory it was given, and its stdin command."""
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text('#!/bin/sh\nline=""\n[ "$1" = -d ] || read -r line\n'
                   f'echo "$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$line" >> {calls}\n')
    exe.chmod(0o755)
