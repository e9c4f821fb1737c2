"""--config FILE + flags -> build_omni_app args (no Ray, no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_ray.cli import build_parser
from omni_ray.cli.serve_config import deep_merge, read_serve_config, serving_args

ROOT = Path(__file__).resolve().parents[2]


def test_deep_merge_flags_over_file():
    base = {"model": "a", "thinker": {"backend": "vllm", "max_num_seqs": 8}}
    over = {"model": None, "thinker": {"backend": None, "device": "cuda"}, "talker": {"x": None}}
    assert deep_merge(base, over) == {"model": "a", "thinker": {"backend": "vllm",
                                      "max_num_seqs": 8, "device": "cuda"}}


def test_serve_flags_override_the_shipped_config():
    sf = read_serve_config(ROOT / "serve_configs" / "tiny_omni.yaml")
    assert sf.http_options == {"host": "127.0.0.1", "port": 8000} and sf.args["model"] == "tiny"
    args = build_parser().parse_args(["serve", "some/model", "--config",
                                      str(ROOT / "serve_configs" / "tiny_omni.yaml"),
                                      "--thinker-backend", "vllm", "--port", "9000"])
    sa, sf = serving_args(args, {"security": {"api_keys_env": "MY_KEYS"}})
    assert sa.model == "some/model" and sa.thinker.backend == "vllm"
    assert sa.talker.max_num_seqs == 32  # from the file
    assert sa.pipeline.chunk_frames == 25 and sa.security.api_keys_env == "MY_KEYS"
    assert args.port == 9000


def test_bad_file_is_an_error(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("proxy_location: EveryNode\n")
    with pytest.raises(ValueError, match="no 'applications'"):
        read_serve_config(bad)
    bad.write_text("applications:\n- args: {pipeline: {mode: fast}}\n")
    args = build_parser().parse_args(["generate", "--text", "a", "--config", str(bad)])
    with pytest.raises(ValueError, match="pipeline.mode"):
        serving_args(args)
