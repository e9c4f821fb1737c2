"""README.md's "Batch jobs on Ray Data" example runs as written (its own process and Ray, the tiny
default made in a fresh OMNI_RAY_HOME) and writes one answered row per input row."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Batch jobs on Ray Data"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_answers_every_row(tmp_path):
    code = readme_example()
    assert '"/tmp/answers"' in code
    code = code.replace('"/tmp/answers"', repr(str(tmp_path / "answers")))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMNI_RAY_HOME=str(tmp_path / "home"),
               RAY_ADDRESS="local", RAY_AUTH_MODE="disabled")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pyarrow.parquet as pq

    rows = pq.read_table(str(tmp_path / "answers")).to_pylist()
    assert sorted(r["id"] for r in rows) == ["q1", "q2"]
    for r in rows:
        assert r["error"] is None and r["text_token_ids"] and r["audio"]  # FLAC bytes
        assert r["audio_seconds"] > 0 and r["sample_rate"] == 24000
