"""``backbone_dir``: the talker backbone's directory for vLLM is the same on every start from one
checkpoint (vLLM's compile cache is keyed by the model path), holds what vLLM needs, is rebuilt
when broken, and racing starts end with one intact directory."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

from omni_ray.runners.vllm.talker_backbone import INDEX, backbone_dir


def test_the_same_directory_every_start_with_the_talkers_config_and_links(tiny_model_dir,
                                                                          tmp_path):
    model = Path(tiny_model_dir)
    first = backbone_dir(model, root=tmp_path)
    mtime = (first / "config.json").stat().st_mtime_ns
    assert backbone_dir(model, root=tmp_path) == first  # reused, not rewritten
    assert (first / "config.json").stat().st_mtime_ns == mtime
    cfg = json.loads((first / "config.json").read_text())
    text = json.loads((model / "config.json").read_text())["talker_config"]["text_config"]
    assert cfg["model_type"] == "qwen3_moe" and cfg["hidden_size"] == text["hidden_size"]
    links = [p for p in first.iterdir() if p.is_symlink()]
    assert links and all(p.resolve() == (model / p.name).resolve() for p in links)
    if (model / INDEX).exists():
        wm = json.loads((first / INDEX).read_text())["weight_map"]
        assert wm and all(k.startswith("talker.") for k in wm)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # nothing left behind


def test_another_checkpoint_gets_its_own_and_a_broken_one_is_rebuilt(tiny_model_dir, tmp_path):
    model = Path(tiny_model_dir)
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in model.iterdir():
        (copy / p.name).symlink_to(p.resolve())
    roots = tmp_path / "root"
    a, b = backbone_dir(model, root=roots), backbone_dir(copy, root=roots)
    assert a != b  # its links point into its own checkpoint
    victim = next(p for p in b.iterdir() if p.is_symlink())
    victim.unlink()
    assert backbone_dir(copy, root=roots) == b and victim.is_symlink()
    (a / "config.json").write_text("{}")
    assert backbone_dir(model, root=roots) == a
    assert json.loads((a / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_racing_starts_end_with_one_directory(tiny_model_dir, tmp_path):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = set(pool.map(lambda _: backbone_dir(tiny_model_dir, root=tmp_path), range(12)))
    (out,) = got
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_moe"
