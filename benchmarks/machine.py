"""Where a result came from (CPU model, cores, load, versions) and how results are written.

Every JSON under ``benchmarks/results/`` carries ``machine``: numbers from a shared or loaded
machine are only comparable within one run, and the load average says how loaded it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """``lscpu``'s model name (falls back to /proc/cpuinfo, then platform)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken CUDA setup must not stop a CPU benchmark
        return None


def code_digest() -> str:
    """sha256 (12 hex) of omni_ray's Python sources: tells apart runs of different code."""
    root = Path(__file__).resolve().parents[1] / "omni_ray"
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def machine_info() -> dict:
    """A snapshot of the machine, taken when called (call it at the start and at the end)."""
    versions = {}
    for mod in ("torch", "transformers", "ray"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    return dict(cpu=cpu_model(), cores=os.cpu_count(), gpu=gpu_name(),
                loadavg_1m=round(os.getloadavg()[0], 2), python=platform.python_version(),
                time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), omni_ray_code=code_digest(),
                **versions)


def write_json(name: str, data: dict, results_dir: Path = RESULTS_DIR) -> Path:
    """Write ``data`` as ``results_dir/name`` (pretty, stable key order); returns the path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / name
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path
