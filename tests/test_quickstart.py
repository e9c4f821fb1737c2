"""`bash scripts/quickstart.sh` exits 0 after an answer and non-zero when the request fails, and
leaves no `serve run` behind (issue 22: it used to exit 15, its own stop trap)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def quickstart(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/quickstart.sh", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)


def no_app_left() -> bool:
    """No `serve run` and nothing on port 8000 (Ray's proxy outliving the script once made the
    next start's client talk to a dying app)."""
    for _ in range(30):
        ps = subprocess.run(["pgrep", "-f", "serve run serve_configs/tiny_omni.yaml"],
                            capture_output=True, text=True)
        try:
            httpx.get("http://127.0.0.1:8000/", timeout=2)
            listening = True
        except httpx.HTTPError:
            listening = False
        if not ps.stdout.strip() and not listening:
            return True
        time.sleep(1)
    return False


def test_quickstart_exit_status(tmp_path):
    ok = quickstart("--max-tokens", "4", "--out", str(tmp_path / "a.wav"))
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert "time to first audio" in ok.stdout and (tmp_path / "a.wav").stat().st_size > 44
    assert no_app_left()
    bad = quickstart("--voice", "no-such-voice", "--max-tokens", "4")
    assert bad.returncode != 0, bad.stdout[-3000:]
    assert "voice" in bad.stdout
    assert no_app_left()
