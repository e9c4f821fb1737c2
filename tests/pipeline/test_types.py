"""A type checker on the pipeline core: mypy, with the settings in pyproject.toml ([tool.mypy]),
over omni_ray/pipeline/ and tests/pipeline/runner_conformance.py (each backend's runner class
against its Protocol in omni_ray/pipeline/contracts.py). Any error fails the test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mypy_on_the_core_and_the_runner_contracts(tmp_path_factory):
    pytest.importorskip("mypy", reason="mypy is in the test extra (pyproject.toml)")
    # A first run reads torch and transformers (about two minutes on 2 cores); a cache kept
    # between runs (OMNI_RAY_MYPY_CACHE) makes the next one take seconds.
    cache = os.environ.get("OMNI_RAY_MYPY_CACHE") or str(tmp_path_factory.mktemp("mypy_cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", cache],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"mypy found errors:\n{proc.stdout}{proc.stderr}"
    assert "Success" in proc.stdout
