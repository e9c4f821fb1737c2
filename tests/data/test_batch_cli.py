"""``omni-ray batch`` as a user runs it (a subprocess with its own Ray): JSONL in, Parquet out,
every row exactly once even when the job is killed halfway and started again, bad lines kept
as rows with an error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

N = 14


def write_rows(path: Path) -> None:
    with path.open("w") as f:
        for i in range(N):
            row = {"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}?"}],
                   "max_tokens": 4, "max_audio_frames": 6}
            if i % 5 == 3:
                row["modalities"] = ["text"]
            f.write(json.dumps(row) + "\n")
        f.write("this line is not JSON\n")
        f.write(json.dumps({"prompt": "A row without an id.", "max_tokens": 3}) + "\n")


def batch(tmp_path: Path, model: str, out: Path, **popen):
    cmd = [sys.executable, "-m", "omni_ray.cli", "batch", "--input", str(tmp_path / "rows.jsonl"),
           "--output", str(out), "--model", model, "--batch-size", "2", "--rows-per-file", "2"]
    env = {**os.environ, "RAY_ADDRESS": "local"}  # a Ray of its own, killed with the job
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True, **popen)


def read_out(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(str(out), columns=["id", "text_token_ids", "error", "audio",
                                            "codec_frames"]).to_pylist()


def test_killed_halfway_and_restarted_every_row_is_written_once(tmp_path, tiny_model_dir):
    write_rows(tmp_path / "rows.jsonl")
    out = tmp_path / "out"
    first = batch(tmp_path, tiny_model_dir, out)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(out.glob("*.parquet"))) < 2:
        assert first.poll() is None, "the job ended before it could be killed"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and its Ray, mid-job
    first.wait(30)
    partial = len(list(out.glob("*.parquet")))
    assert 2 <= partial, partial

    second = batch(tmp_path, tiny_model_dir, out)
    stdout, _ = second.communicate(timeout=600)
    assert second.returncode == 0, stdout
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["rows"] == N + 2 and summary["duplicates"] == 0
    assert 0 < summary["rows_before"] < N + 2 and summary["rows_now"] == N + 2 - summary["rows_before"]

    rows = read_out(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == N + 2  # every row exactly once
    by_id = {r["id"]: r for r in rows}
    for i in range(N):
        r = by_id[f"r{i}"]
        assert r["error"] is None and len(r["text_token_ids"]) == 4
        assert (r["audio"] is None) == (i % 5 == 3) and r["codec_frames"] == (0 if i % 5 == 3 else 6)
    bad = [r for r in rows if r["id"].startswith("line-") and r["error"]]
    assert len(bad) == 1 and "messages: not valid JSON" in bad[0]["error"]
    no_id = [r for r in rows if r["id"].startswith("line-") and not r["error"]]
    assert len(no_id) == 1 and len(no_id[0]["text_token_ids"]) == 3


def test_a_missing_input_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "omni_ray.cli", "batch", "--input",
                           str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--input: no such file" in proc.stderr
