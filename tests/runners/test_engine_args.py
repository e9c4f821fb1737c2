"""runners/vllm/engine_args.py and runners/factory.py: what a vLLM stage's engine gets out of its
``StageConfig`` (no engine started; vLLM is not imported)."""

from __future__ import annotations

import pytest
import torch

from omni_ray.config.serving import StageConfig
from omni_ray.runners.factory import check_backend, dtype_name, stage_config
from omni_ray.runners.vllm.engine_args import CPU_ENGINE_DEFAULTS, engine_kwargs


def test_cpu_defaults_then_max_model_len_then_the_config(tmp_path):
    cfg = StageConfig(backend="vllm", engine_kwargs={"enforce_eager": False, "max_num_batched_tokens": 64})
    kw = engine_kwargs(tmp_path, cfg, max_model_len=2048)
    assert kw == {**CPU_ENGINE_DEFAULTS, "max_model_len": 2048, "enforce_eager": False,
                  "max_num_batched_tokens": 64}
    assert engine_kwargs(tmp_path, cfg.model_copy(update={"engine_kwargs": {"max_model_len": 99}}),
                         max_model_len=2048)["max_model_len"] == 99  # the config wins


def test_gpu_gets_no_cpu_defaults_and_offline_no_max_model_len(tmp_path):
    assert engine_kwargs(tmp_path, StageConfig(backend="vllm", device="cuda")) == {}
    talker = engine_kwargs(tmp_path, StageConfig(backend="vllm"),
                           cpu_defaults={**CPU_ENGINE_DEFAULTS, "kv_cache_memory_bytes": 1})
    assert talker["kv_cache_memory_bytes"] == 1 and "max_model_len" not in talker


def test_dummy_checkpoint_loads_dummy_weights(tmp_path):
    from omni_ray.models.dummy import MARKER

    cfg = StageConfig(backend="vllm")
    assert "load_format" not in engine_kwargs(tmp_path, cfg)
    (tmp_path / MARKER).write_text('{"shape": "tiny"}')
    assert engine_kwargs(tmp_path, cfg)["load_format"] == "dummy"
    chosen = cfg.model_copy(update={"engine_kwargs": {"load_format": "auto"}})
    assert engine_kwargs(tmp_path, chosen)["load_format"] == "auto"


def test_stage_config_from_offline_arguments():
    cfg = stage_config("talker", "vllm", device="cuda:1", dtype=torch.bfloat16, max_num_seqs=8,
                       engine_kwargs={"max_model_len": 64})
    assert (cfg.backend, cfg.device, cfg.dtype, cfg.max_num_seqs) == ("vllm", "cuda:1", "bfloat16", 8)
    assert cfg.engine_kwargs == {"max_model_len": 64}
    assert dtype_name(None) == dtype_name("float32") == dtype_name(torch.float32) == "float32"
    with pytest.raises(ValueError, match="code2wav_backend"):
        check_backend("code2wav", "vllm")
    with pytest.raises(ValueError, match="talker_engine_kwargs"):
        stage_config("talker", engine_kwargs={"x": 1})
