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


def _env(tmp_path: Path, **extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMNI_RAY_HOME=str(tmp_path / "home"),
                RAY_AUTH_MODE="disabled", RAY_ADDRESS="local", **extra)  # a Ray of its own,
    # never another on the box (ray.init() would join the newest running cluster)


def _raylet_env(sid: int) -> dict:
    """The environment of the raylet the served app started (in its session)."""
    for line in _session_left(sid):
        pid = line.split()[0]
        if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)
    raise AssertionError(f"no raylet in the served app's session: {_session_left(sid)}")


@pytest.mark.parametrize("mps", [False, True], ids=["plain", "mps"])
def test_serve_answers_then_stops_on_ctrl_c(tiny_model_dir, tmp_path, get_free_port, mps):
    """... and with ``--mps`` it starts a private MPS daemon before Ray (whose processes get its
    pipe directory) and tells it to quit after Ray is down. CPU machines lack NVIDIA's binary: a
    script of its name records the calls (tests/test_mps.py); the real one ran on the H200."""
    from openai import OpenAI

    from fake_mps import fake_control

    port = get_free_port()
    env = _env(tmp_path)
    calls = tmp_path / "calls.txt"
    if mps:
        fake_control(tmp_path / "bin", calls)
        env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    log = open(tmp_path / "serve.log", "w")
    # Its own session: everything it starts (Ray's processes) shares the session id, so "no
    # process left" is checked exactly, without touching anyone else's Ray.
    proc = subprocess.Popen([sys.executable, "-m", "omni_ray.cli", "serve", tiny_model_dir,
                             "--port", str(port), "--model-id", "tiny-omni",
                             *(["--mps"] if mps else [])],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health")
        pipe = _raylet_env(proc.pid).get("CUDA_MPS_PIPE_DIRECTORY")
        if mps:
            started = calls.read_text().splitlines()
            assert started == [f"-d pipe={pipe} stdin="] and pipe.endswith("/pipe"), started
        else:
            assert pipe is None and not calls.exists()
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
    if mps:
        assert "GPUs shared through MPS" in printed
        assert calls.read_text().splitlines()[1:] == [f" pipe={pipe} stdin=quit"]
    assert "RANDOM weights" in printed  # the tiny checkpoint, said as a warning
    left = []
    for _ in range(30):
        left = _session_left(proc.pid)
        if not left:
            break
        time.sleep(1)
    assert not left, left


@pytest.mark.parametrize("case", ["no-daemon-binary", "joins-a-cluster"])
def test_mps_refusals_are_usage_errors_before_anything_starts(tiny_model_dir, tmp_path, case):
    """``--mps`` where it cannot work exits 2 naming why, before Ray starts: without NVIDIA's
    control binary (CPU machines), or when joining a running cluster through RAY_ADDRESS (its
    processes started elsewhere, never under this daemon)."""
    env = _env(tmp_path)
    if case == "joins-a-cluster":
        env["RAY_ADDRESS"] = "10.0.0.1:6379"
        want = "unset RAY_ADDRESS"
    else:
        env["PATH"] = str(Path(sys.executable).parent)
        want = "nvidia-cuda-mps-control not found"
    out = subprocess.run([sys.executable, "-m", "omni_ray.cli", "serve", tiny_model_dir,
                          "--mps"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 2, out.stderr
    assert "--mps" in out.stderr and want in out.stderr, out.stderr
    assert "deploying" not in out.stderr
