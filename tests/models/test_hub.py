"""Hub ids resolve through huggingface_hub's cache (issue 22), offline, against a cache pre-filled
in the hub's own layout (models--owner--name/snapshots/<sha>/..., refs/<revision>).

Run in subprocesses: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAIN, V1 = "a" * 40, "b" * 40
RESOLVE = ("import sys\nfrom omni_ray.config.serving import OmniServingArgs\n"
           "try:\n    a = OmniServingArgs(model=sys.argv[1], revision=sys.argv[2] or None)\n"
           "    print(a.checkpoint_dir())\n"
           "except FileNotFoundError as e:\n    print(e, file=sys.stderr); sys.exit(3)\n")


def _fill_cache(home: Path, tiny: Path) -> Path:
    repo = home / "hub" / "models--acme--omni-tiny"
    for sha, ref in ((MAIN, "main"), (V1, "v1")):
        snap = repo / "snapshots" / sha
        snap.mkdir(parents=True)
        for f in tiny.iterdir():  # the hub links snapshot files to blobs; links to the files here
            (snap / f.name).symlink_to(f.resolve())
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(sha)
    return repo


def _resolve(home: Path, model: str, revision: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", RESOLVE, model, revision], capture_output=True,
                          text=True, env=env, timeout=120)


def test_hub_id_resolves_offline_from_the_cache(tiny_model_dir, tmp_path):
    repo = _fill_cache(tmp_path / "hf", Path(tiny_model_dir))
    got = _resolve(tmp_path / "hf", "acme/omni-tiny")
    assert got.returncode == 0, got.stderr
    path = Path(got.stdout.strip())
    assert path == repo / "snapshots" / MAIN
    assert json.loads((path / "config.json").read_text())["talker_config"]["speaker_id"]
    tagged = _resolve(tmp_path / "hf", "acme/omni-tiny", "v1")
    assert Path(tagged.stdout.strip()) == repo / "snapshots" / V1, tagged.stderr


def test_missing_id_or_path_is_an_error_naming_it(tmp_path):
    (tmp_path / "hf").mkdir()
    got = _resolve(tmp_path / "hf", "acme/not-cached")
    assert got.returncode == 3 and "'acme/not-cached'" in got.stderr
    assert "not in the Hugging Face cache" in got.stderr
    got = _resolve(tmp_path / "hf", str(tmp_path / "no" / "such" / "dir"))
    assert got.returncode == 3
    assert f"no checkpoint directory at '{tmp_path}/no/such/dir'" in got.stderr


@pytest.mark.parametrize("model, hub", [("Qwen/Qwen3-Omni-30B-A3B-Instruct", True),
                                        ("./Qwen/x", False), ("/abs/path", False),
                                        ("a/b/c", False), ("tiny", False)])
def test_is_hub_id(model, hub):
    from omni_ray.models.hub import is_hub_id

    assert is_hub_id(model) is hub
