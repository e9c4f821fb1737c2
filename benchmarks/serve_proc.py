"""`serve run <config.yaml>` as a subprocess, the way an operator starts the app (gpu_check.py).

The process runs in its own process group on a fresh local Ray cluster (``--address local``), with
the repository root on ``PYTHONPATH`` (Ray's raylet and workers inherit ``serve run``'s environment,
so no ``runtime_env`` is needed when omni_ray is not pip-installed) and a per-run marker variable:
``stop()`` ends the process group, then every process that still carries the marker (Ray daemons
and workers that left the group), by pid; ``ray_stop=True`` adds ``ray stop --force`` (a machine of
its own only: it ends every Ray cluster of the user).
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
MARKER = "OMNI_RAY_SERVE_PROC"
# a stage engine's "loaded and warmed up" line (omni_ray/stages/engine.py)
ENGINE_STARTED = re.compile(r"omni_ray: (\w+) engine: start phases (\{[^}]*\})")


def cli(name: str) -> str:
    """The ``serve`` / ``ray`` entry point next to this Python, else the one on PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"no `{name}` command next to {sys.executable} or on PATH")
    return found


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    # every line in the log: Ray merges lines that differ only in numbers within 5 s, such as
    # two replicas' "engine: start phases" (ServeRun.engine_starts counts them)
    env["RAY_DEDUP_LOGS"] = "0"
    env.update(extra or {})
    return env


# a line saying why a process or Ray ended: Python's exceptions, glog's E/F lines, Ray's node and
# worker deaths (what ``serve run`` prints before it exits, and Ray's session logs)
ERROR_LINE = re.compile(r"(\w+(Error|Exception)\b|^\[[^]]*\] \([^)]*\) [EF]\d|^[EF]\d{4} |"
                        r"Check failed|\bdied\b|\bdead\b|[Kk]illed|SIG(TERM|KILL|SEGV|ABRT))")


class ServeExited(RuntimeError):
    """``serve run`` itself ended while its app was starting (not Serve giving up a deploy,
    which leaves it running): the local Ray cluster it started did not come up or went down."""


def error_lines(path: Path, n: int = 6) -> list[str]:
    """The last ``n`` lines of ``path`` that say why something ended (``ERROR_LINE``)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip()[:300] for line in lines if ERROR_LINE.search(line)][-n:]


def ray_session_errors(since: float, n: int = 4) -> list[str]:
    """The error lines of the Ray session started after ``since`` (epoch seconds; the newest
    under Ray's temp dir): its raylet, GCS and driver logs, where Ray writes why a node or the
    driver ended."""
    root = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"
    sessions = []
    for d in root.glob("session_2*"):
        with contextlib.suppress(OSError):  # another run's session, removed meanwhile
            if (t := d.stat().st_mtime) >= since - 1:
                sessions.append((t, d))
    if not sessions:
        return []
    logs = max(sessions)[1] / "logs"
    out = []
    for pattern in ("raylet.out", "gcs_server.out", "python-core-driver-*.log"):
        for f in sorted(logs.glob(pattern)):
            out += [f"{f.name}: {line}" for line in error_lines(f, n)]
    return out


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


class ServeRun:
    """``with ServeRun(cfg_yaml, log) as s: s.wait_healthy(url, timeout)``; stopped on exit."""

    def __init__(self, config: Path, log: Path, env: dict | None = None, ray_stop: bool = False):
        self.config, self.log, self.ray_stop = Path(config), Path(log), ray_stop
        self.marker = uuid.uuid4().hex
        self.env = child_env({**(env or {}), MARKER: self.marker})
        self.proc: subprocess.Popen | None = None
        self.t_launch: float | None = None
        self.launched_at: float | None = None  # epoch seconds (Ray's session dirs)

    def __enter__(self) -> "ServeRun":
        if self.proc is not None:  # already launched (``with`` on a started run): the same app
            return self
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._logf = open(self.log, "wb")
        self.t_launch, self.launched_at = time.perf_counter(), time.time()
        self.proc = subprocess.Popen(
            [cli("serve"), "run", "--address", "local", str(self.config)], cwd=REPO_ROOT,
            env=self.env, stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        """Seconds from launch until ``GET url/health`` answers 200; raises on exit, on Serve
        giving up the deploy (``serve run`` keeps running then: without this the wait lasted
        the whole timeout, 10 minutes of a GPU machine, for a missing module) or timeout."""
        end = self.t_launch + timeout_s
        scan = _DeployScan(self.log)
        while time.perf_counter() < end:
            if self.proc.poll() is not None:
                raise self.exited()
            failed = scan.failure()
            if failed:
                raise RuntimeError(f"Serve could not deploy the app: {failed}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    return time.perf_counter() - self.t_launch
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"not healthy after {timeout_s:.0f}s")

    def engine_starts(self) -> list[tuple[str, dict]]:
        """(stage, start phases) of each stage engine started so far, in log order: an engine
        logs them once it is loaded and warmed up (omni_ray/stages/engine.py), when its replica
        can take requests. A stage with several replicas logs one line per engine."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [(m[1], ast.literal_eval(m[2])) for m in ENGINE_STARTED.finditer(text)]

    def wait_engines(self, want: dict[str, int], timeout_s: float) -> float:
        """Seconds from launch until the log shows ``want[stage]`` engines of each stage
        started. ``/health`` and a first answer need one replica of each stage; a second replica
        starts after the first (GPU start turns) and warms up for a minute more, and a bench run
        meanwhile measures one replica beside a warm-up. Raises on exit or timeout."""
        end = self.t_launch + timeout_s
        while True:
            got = Counter(stage for stage, _ in self.engine_starts())
            if all(got[s] >= n for s, n in want.items()):
                return time.perf_counter() - self.t_launch
            if self.proc.poll() is not None:
                raise self.exited()
            if time.perf_counter() >= end:
                raise TimeoutError(f"engines started {dict(got)}, want {want}")
            time.sleep(1.0)

    def exited(self) -> ServeExited:
        """The error for ``serve run`` having ended: its exit status, and why, as far as its log
        and its Ray session's logs say (CI saw a bare "exited with 1" once, on a variant's start
        right after the base's stop, and no log was kept)."""
        why = error_lines(self.log) + ray_session_errors(self.launched_at)
        return ServeExited(f"`serve run` exited with {self.proc.returncode}"
                           + (": " + " | ".join(why) if why else " (no error in its logs)"))

    def since_launch(self) -> float:
        return time.perf_counter() - self.t_launch

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait_s in ((signal.SIGINT, 60), (signal.SIGTERM, 15), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
        kill_marked(self.marker)
        if self.ray_stop:
            subprocess.run([cli("ray"), "stop", "--force"], env=self.env, capture_output=True,
                           timeout=120)
        if not self._logf.closed:
            self._logf.close()

    def __exit__(self, *exc) -> None:
        self.stop()


class _DeployScan:
    """Reads a ``serve run`` log as it grows for Serve's "Deploying app '...' failed" and the
    exception it names (e.g. ``ModuleNotFoundError: No module named 'x'``)."""

    FAILED = re.compile(r"Deploying app '[^']*' failed")
    ERROR = re.compile(r"\b(\w+(?:Error|Exception): .*)$")

    def __init__(self, log: Path):
        self.log, self.offset, self.text = log, 0, ""
        self.failed_at: float | None = None

    def failure(self) -> str | None:
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                new = f.read()
        except OSError:
            return None
        self.offset += len(new)
        self.text = (self.text + new.decode(errors="replace"))[-200_000:]
        m = self.FAILED.search(self.text)
        if m is None:
            return None
        self.failed_at = self.failed_at or time.monotonic()
        errors = [e.group(1) for line in self.text[m.end():].splitlines()
                  if (e := self.ERROR.search(line))]
        if errors:
            return errors[-1]
        # the traceback follows the line: give it a few seconds to reach the log
        return m.group(0) if time.monotonic() - self.failed_at > 5 else None


def marked_pids(marker: str) -> list[int]:
    """Pids of this user's processes whose environment holds ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def kill_marked(marker: str, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, to every process started for this run."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = marked_pids(marker)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        while pids and marked_pids(marker) and time.monotonic() < end:
            time.sleep(0.2)
