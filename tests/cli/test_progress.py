"""Status lines on stderr (``omni_ray/cli/progress.py``): on a terminal a slow step's line is
rewritten in place and ends ``done (N s)``; into a pipe the CLI prints nothing but warnings
(stdout stays exactly the answer) unless ``--progress`` forces plain status lines; ``--quiet``
silences them even on a terminal. The commands run as subprocesses, the terminal a real pty."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from omni_ray.cli.progress import ALWAYS, AUTO, NEVER, Progress

ROOT = Path(__file__).resolve().parents[2]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, mode, shown", [
    (io.StringIO, AUTO, False), (io.StringIO, ALWAYS, True), (io.StringIO, NEVER, False),
    (_Terminal, AUTO, True), (_Terminal, NEVER, False)])
def test_when_status_lines_show(stream, mode, shown):
    s = stream()
    with Progress(mode, s).step("loading"):
        pass
    assert ("loading" in s.getvalue()) is shown and ("done (" in s.getvalue()) is shown


def test_a_failed_step_says_so():
    s = io.StringIO()
    with pytest.raises(RuntimeError), Progress(ALWAYS, s).step("loading"):
        raise RuntimeError("boom")
    assert s.getvalue().splitlines() == ["loading ...", s.getvalue().splitlines()[1]]
    assert s.getvalue().splitlines()[1].startswith("loading: failed (")


def _env(tmp_path) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMNI_RAY_HOME=str(tmp_path / "home"))


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "omni_ray.cli", *argv]


def _on_a_terminal(argv: list[str], env: dict) -> tuple[str, str]:
    """Run with stderr on a pty: (stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
    os.close(slave)
    got = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        got += data
    os.close(master)
    out = proc.stdout.read()
    assert proc.wait(timeout=300) == 0, got.decode()[-2000:]
    return out, got.decode()


@pytest.mark.slow
def test_make_tiny_on_a_terminal_and_quiet(tmp_path):
    out, tty = _on_a_terminal(_cli("make-tiny", str(tmp_path / "a")), _env(tmp_path))
    assert out.strip() == str(tmp_path / "a")  # stdout: the path alone
    what = f"making the tiny checkpoint in {tmp_path / 'a'} (random weights)"
    assert tty.startswith(f"{what} ...")
    last = tty.rstrip("\r\n").split("\r")[-1]
    assert last.startswith(f"{what} ... done (") and last.endswith(" s)\x1b[K"), repr(tty[-300:])
    assert "Writing model shards" not in tty  # transformers' own bar stays off

    out, tty = _on_a_terminal(_cli("make-tiny", str(tmp_path / "b"), "--quiet"), _env(tmp_path))
    assert out.strip() == str(tmp_path / "b") and tty == ""


@pytest.mark.slow
def test_piped_stderr_holds_only_warnings_unless_forced(tiny_model_dir, tmp_path):
    env = _env(tmp_path)
    proc = subprocess.run(_cli("generate", "--model", tiny_model_dir, "--text", "Hi",
                               "--modalities", "text", "--max-tokens", "3", "--json"),
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    json.loads(proc.stdout)  # stdout: exactly one JSON object
    lines = proc.stderr.splitlines()
    assert lines and all(line.startswith("WARNING: ") for line in lines), lines
    assert "RANDOM weights" in proc.stderr  # honesty is not progress: said either way

    wav = tmp_path / "x.wav"
    proc = subprocess.run(_cli("speak", "--model", tiny_model_dir, "--text", "Hi", "--out",
                               str(wav), "--max-audio-frames", "4", "--progress"),
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = [line for line in proc.stderr.splitlines() if not line.startswith("WARNING: ")]
    load = f"loading {tiny_model_dir} (thinker, talker, code2wav) on cpu"
    assert status[:2] == [f"{load} ...", status[1]] and status[1].startswith(f"{load}: done (")
    assert status[2] == "speaking ..." and status[3].startswith("speaking: done (")
    assert len(status) == 4 and "\r" not in proc.stderr  # plain lines in a log
    assert proc.stdout.startswith(f"wrote {wav} (") and wav.stat().st_size > 44
