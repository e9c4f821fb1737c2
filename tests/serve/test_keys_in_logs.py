"""API keys never reach a log or the console (issue 18), whichever way they are configured.

One real ``serve run`` (a subprocess with its own Ray session under a private ``RAY_TMPDIR``) of a
config with two apps:

- ``cfg``: ``omni_ray:build_omni_app`` with keys from ``security.api_keys_env`` (the env var of
  the node) and ``security.api_keys_file`` (a file);
- ``py``: a module that calls ``build_omni_app`` from Python with a ``SecretStr`` key.

Authenticated requests with each key (and refused ones with a wrong key) go through real HTTP;
then every file under that Ray session's directory and the captured console are searched for
every key. Serve's "Importing application 'cfg' with arguments {...}" line must be there (the
args are printed) and hold no key.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ENV_VAR = "OMNI_RAY_TEST_KEYS_IN_LOGS"
KEYS = {name: f"sk-{name}-{uuid.uuid4().hex}" for name in ("env", "file", "py")}
WRONG = f"sk-wrong-{uuid.uuid4().hex}"
LIMITS = {"max_prompt_tokens": 256, "default_max_tokens": 2, "default_max_audio_frames": 8}
BODY = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

PY_APP = '''
from pathlib import Path
from pydantic import SecretStr
from omni_ray import build_omni_app

HERE = Path(__file__).parent
app = build_omni_app({{"model": {model!r}, "model_id": "qwen3-omni",
                       "limits": {limits!r},
                       "security": {{"api_keys": [SecretStr((HERE / "py_key").read_text().strip())],
                                    "api_keys_env": None}}}})
'''


def _config(tmp: Path, model_dir: str, port: int) -> str:
    import yaml

    cfg_args = {"model": model_dir, "model_id": "qwen3-omni", "limits": LIMITS,
                "security": {"api_keys_env": ENV_VAR, "api_keys_file": str(tmp / "keys.txt")}}
    return yaml.safe_dump({
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {"name": "cfg", "route_prefix": "/cfg", "import_path": "omni_ray:build_omni_app",
             "args": cfg_args},
            {"name": "py", "route_prefix": "/py", "import_path": "keyed_app:app"},
        ]})


@pytest.fixture(scope="module")
def serve_run(tiny_model_dir, get_free_port):
    """The running ``serve run``: (base URL, its Ray temp dir, its console file)."""
    # Short: Ray's socket paths under it must stay within the 107-byte Unix limit.
    tmp = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))
    (tmp / "keys.txt").write_text(f"# keys of the cfg app\n{KEYS['file']}\n")
    (tmp / "py_key").write_text(KEYS["py"] + "\n")
    (tmp / "keyed_app.py").write_text(textwrap.dedent(
        PY_APP.format(model=tiny_model_dir, limits=LIMITS)))
    port = get_free_port()
    (tmp / "serve.yaml").write_text(_config(tmp, tiny_model_dir, port))
    env = dict(os.environ, RAY_TMPDIR=str(tmp / "ray"), **{ENV_VAR: KEYS["env"]})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp), env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    (tmp / "ray").mkdir()
    console = tmp / "console.txt"
    serve_exe = Path(sys.executable).parent / "serve"
    with open(console, "wb") as out:
        proc = subprocess.Popen([str(serve_exe), "run", "--address", "local",
                                 str(tmp / "serve.yaml")], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc, console)
        yield base, tmp / "ray", console, proc
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_healthy(base: str, proc: subprocess.Popen, console: Path, deadline_s: float = 420):
    end = time.monotonic() + deadline_s
    while True:
        assert proc.poll() is None, console.read_text(errors="replace")[-4000:]
        try:
            if all(httpx.get(f"{base}/{app}/health", timeout=5).status_code == 200
                   for app in ("cfg", "py")):
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < end, console.read_text(errors="replace")[-4000:]
        time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C, as a person would (serve run then shuts Serve and its local Ray down)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _chat(base: str, app: str, key: str) -> int:
    r = httpx.post(f"{base}/{app}/v1/chat/completions", json=BODY,
                   headers={"authorization": f"Bearer {key}"}, timeout=120)
    if r.status_code == 401:
        assert key not in r.text  # the 401 body does not repeat the token
    return r.status_code


def test_keys_from_env_file_and_python_work_and_never_reach_logs(serve_run):
    base, ray_dir, console, proc = serve_run
    # 1) Every key works where it was configured; wrong and crossed keys are refused.
    assert _chat(base, "cfg", KEYS["env"]) == 200
    assert _chat(base, "cfg", KEYS["file"]) == 200
    assert _chat(base, "py", KEYS["py"]) == 200
    assert _chat(base, "cfg", WRONG) == 401
    assert _chat(base, "py", KEYS["env"]) == 401
    assert _chat(base, "cfg", KEYS["py"]) == 401
    # 2) Stop serve run so that every log is flushed and closed.
    _stop(proc)
    files = [p for p in ray_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.suffix == ".log" for p in files), files
    texts = {p: p.read_bytes() for p in files}
    texts[console] = console.read_bytes()
    # 3) Serve printed the cfg app's args (what issue 18 found keys in), without a key.
    importing = [line for data in texts.values() for line in data.splitlines()
                 if b"Importing application 'cfg' with arguments" in line]
    assert importing and all(b"api_keys_file" in line for line in importing), importing
    # 4) No key anywhere: every log, every worker's .out/.err, the console.
    leaks = {name: [str(p) for p, data in texts.items() if key.encode() in data]
             for name, key in KEYS.items()}
    assert leaks == {name: [] for name in KEYS}, leaks
