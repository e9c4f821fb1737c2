"""NVIDIA MPS for the stages sharing a GPU (omni_ray/mps.py): a private control daemon per run.
The real daemon ran under gpu_check's MPS variant on the H200 (benchmarks/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_mps import fake_control


def test_a_private_daemon_is_started_and_told_to_quit(tmp_path, monkeypatch):
    """``omni-ray serve --mps`` and ``gpu_check --ab NAME:mps=true``: the daemon gets its own
    pipe/log directories (the app's processes get them through the environment) and is told to
    quit afterwards."""
    from omni_ray.mps import mps_daemon

    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control not found"):
        with mps_daemon(tmp_path / "m0"):
            pass
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    fake_control(bin_dir, calls)
    monkeypatch.setenv("PATH", str(bin_dir))
    with mps_daemon(tmp_path / "m1") as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "m1" / "pipe")
        assert Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        assert calls.read_text().split("\n")[0].startswith(f"-d pipe={tmp_path}/m1/pipe")
    assert calls.read_text().splitlines()[1] == f" pipe={tmp_path}/m1/pipe stdin=quit"
