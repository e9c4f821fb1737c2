"""NVIDIA MPS for the stages sharing a GPU (``omni-ray serve --mps``, ``gpu_check --ab
NAME:mps=true``).

Without MPS the stage processes sharing one GPU time-slice it: a kernel of one process never runs
beside a kernel of another, so the talker's small latency-bound kernels wait behind the
thinker's. Under an MPS control daemon every CUDA process that finds its pipe directory becomes a
client of one MPS server, and kernels of different processes run at once (one H200, session 15:
the talker's step 12.1 -> 10.5 ms at concurrency 1, RTF 0.155 -> 0.140; benchmarks/README.md).
The daemon here is private to the run (its own pipe and log directories, passed to the processes
it starts through the environment) and is told to quit afterwards; nothing about the GPU's own
settings changes. A cluster enables MPS on its nodes instead (e.g. the NVIDIA device plugin's MPS
sharing; cluster/README.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
# What MPS reads in a client process's environment: its share of the SMs, its priority (1:
# below normal). A stage sets them through ``engine_resources.mps_*`` (config/serving.py).
SM_PERCENT_ENV, PRIORITY_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_CLIENT_PRIORITY"


@contextmanager
def mps_daemon(root: Path) -> Iterator[dict]:
    """Start an MPS control daemon with its directories under ``root``; yields the environment a
    process needs to be its client; quits the daemon (and its server) on exit."""
    exe = shutil.which(CONTROL)
    if exe is None:
        raise RuntimeError(f"{CONTROL} not found: MPS is not available on this machine "
                           "(it comes with the NVIDIA driver on GPU nodes)")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for d in env.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    try:
        subprocess.run([exe, "-d"], env=full, check=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"{CONTROL} -d failed: {e}") from e
    try:
        yield env
    finally:
        subprocess.run([exe], input=b"quit\n", env=full, timeout=120, capture_output=True)
