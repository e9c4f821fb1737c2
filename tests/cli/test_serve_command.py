"""`omni-ray serve MODEL --port P`: serves the app, answers an openai-client chat request, and
Ctrl-C (SIGINT) stops Serve and Ray and exits 0 with no process left (issue 22)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 780) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "omni-ray serve exited early"
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise AssertionError(f"{url} not healthy in {timeout_s} s")


def _session_left(sid: int) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,sid,args", "--no-headers"], capture_output=True,
                        text=True).stdout.splitlines()
    return [line for line in ps if line.split()[1] == str(sid)]


def test_serve_answers_then_stops_on_ctrl_c(tiny_model_dir, tmp_path, get_free_port):
    from openai import OpenAI

    port = get_free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMNI_RAY_HOME=str(tmp_path / "home"),
               RAY_AUTH_MODE="disabled", RAY_ADDRESS="local")  # a Ray of its own, never
    # another on the box (ray.init() would join the newest running cluster)
    log = open(tmp_path / "serve.log", "w")
    # Its own session: everything it starts (Ray's processes) shares the session id, so "no
    # process left" is checked exactly, without touching anyone else's Ray.
    proc = subprocess.Popen([sys.executable, "-m", "omni_ray.cli", "serve", tiny_model_dir,
                             "--port", str(port), "--model-id", "tiny-omni"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health")
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=300)
        answer = client.chat.completions.create(
            model="tiny-omni", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
            modalities=["text", "audio"], audio={"voice": "Ethan", "format": "wav"},
            extra_body={"max_audio_frames": 6})
        assert answer.choices[0].message.content and answer.choices[0].message.audio.data
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    printed = (tmp_path / "serve.log").read_text()
    assert f"ready at http://127.0.0.1:{port}/v1" in printed
    assert "RANDOM weights" in printed  # the tiny checkpoint, said as a warning
    left = []
    for _ in range(30):
        left = _session_left(proc.pid)
        if not left:
            break
        time.sleep(1)
    assert not left, left
