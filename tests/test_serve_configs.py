"""The Serve configs in serve_configs/ load, and the builder turns them into Serve options.

Nothing here starts Ray: configs are validated by ``OmniServingArgs`` (and Ray Serve's own
config schema), and ``deployment_options`` is a pure function.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from omni_ray.builders.app import deployment_options, stage_deployment_name
from omni_ray.config.serving import EngineResources, OmniServingArgs, StageConfig

REPO = Path(__file__).resolve().parents[1]
SERVE_CONFIGS = sorted((REPO / "serve_configs").glob("*.yaml"))
STAGES = ("thinker", "talker", "code2wav")

# Importing ray.serve's config models warns about Ray's own pydantic usage: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")


def load_args(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["applications"][0]["args"]


def validate(args: dict, tmp_path: Path) -> OmniServingArgs:
    """``OmniServingArgs.model_validate(args)``: validation never touches the filesystem (the
    production checkpoint lives on the cluster's model volume, not here)."""
    return OmniServingArgs.model_validate(copy.deepcopy(args))


def test_serve_configs_exist():
    names = {p.name for p in SERVE_CONFIGS}
    assert {"tiny_omni.yaml", "qwen3_omni.yaml"} <= names


# -- every config ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_config_has_serve_shape(path):
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load(path.read_text())
    assert isinstance(config, dict) and config["applications"], "no applications"
    for app in config["applications"]:
        assert app["import_path"] == "omni_ray:build_omni_app"
        assert isinstance(app["args"], dict)
    ServeDeploySchema.model_validate(config)  # what `serve deploy` checks


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_config_args_validate(path, tmp_path):
    args = validate(load_args(path), tmp_path)
    # Thinker engine_kwargs.max_model_len (vLLM's limit) and args.max_model_len (the ingress's)
    # must agree, or the ingress admits prompts the engine rejects.
    vllm_len = args.thinker.engine_kwargs.get("max_model_len")
    assert vllm_len in (None, args.max_model_len)
    assert args.limits.max_prompt_tokens + args.limits.max_tokens <= args.max_model_len


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_config_options_accepted_by_serve(path, tmp_path):
    """Every stage's options pass ``serve.deployment``'s own checks (which start no Ray)."""
    from ray import serve

    args = validate(load_args(path), tmp_path)

    class Stage:  # stands in for the stage server class
        pass

    for stage in STAGES:
        opts = deployment_options(stage, getattr(args, stage), args.model_id)
        assert serve.deployment(Stage, **opts).name == opts["name"]


def test_production_config(tmp_path):
    args = validate(load_args(REPO / "serve_configs" / "qwen3_omni.yaml"), tmp_path)
    assert args.pipeline.mode == "async_chunk"
    assert (args.pipeline.initial_chunk_frames, args.pipeline.chunk_frames,
            args.pipeline.ramp_chunks, args.pipeline.left_context_frames) == (1, 25, True, 25)
    assert args.thinker.backend == "vllm" and args.thinker.engine_resources.num_gpus == 1
    assert args.thinker.engine_kwargs["tensor_parallel_size"] == 1
    for stage in STAGES:
        cfg = getattr(args, stage)
        assert (cfg.device, cfg.dtype) == ("cuda", "bfloat16")
    # talker and code2wav share one GPU.
    assert args.talker.engine_resources.num_gpus + args.code2wav.engine_resources.num_gpus == 1
    assert args.thinker.default_sampling.temperature == 0.7
    assert args.thinker.default_sampling.top_p == 0.9
    talker = args.talker.default_sampling
    assert (talker.temperature, talker.top_k, talker.repetition_penalty) == (0.9, 50, 1.05)
    assert args.security.api_keys == [] and args.security.api_keys_env == "OMNI_RAY_API_KEYS"


# -- invalid configs fail at load, naming the field ----------------------------------------------
def tiny_args() -> dict:
    return load_args(REPO / "serve_configs" / "tiny_omni.yaml")


def _with(path: str, value) -> dict:
    """tiny_omni.yaml's args with the dotted ``path`` set to ``value``."""
    args = tiny_args()
    *parents, leaf = path.split(".")
    node = args
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return args


@pytest.mark.parametrize("path, value, expected", [
    ("thinker.max_batch", 8, ["thinker.max_batch", "Extra inputs are not permitted"]),
    ("pipeline.mode", "streaming", ["pipeline.mode", "'sync' or 'async_chunk'"]),
    ("talker.dtype", "fp8", ["talker.dtype", "'bfloat16'"]),
    ("code2wav.deployment_config.num_replica", 2,
     ["code2wav.deployment_config", "unknown Serve deployment option(s) ['num_replica']"]),
    ("code2wav.backend", "vllm", ["code2wav.backend"]),
    ("thinker.device", "gpu", ["thinker.device", "'cpu', 'cuda' or 'cuda:N'"]),
    ("thinker.engine_resources.num_gpu", 1, ["thinker.engine_resources.num_gpu"]),
    ("thinker.engine_resources.mps_sm_percent", 0,
     ["thinker.engine_resources.mps_sm_percent", "greater than or equal to 1"]),
    ("code2wav.engine_resources.mps_sm_percent", 150,
     ["code2wav.engine_resources.mps_sm_percent", "less than or equal to 100"]),
], ids=["unknown-stage-option", "bad-mode", "bad-dtype", "unknown-deployment-config-key",
        "vllm-code2wav", "bad-device", "unknown-engine-resource", "mps-share-zero",
        "mps-share-over-100"])
def test_invalid_config_names_the_field(path, value, expected):
    with pytest.raises(ValidationError) as err:
        OmniServingArgs.model_validate(_with(path, value))
    message = str(err.value)
    for part in expected:
        assert part in message, message


def test_invalid_yaml_config_fails_at_load(tmp_path):
    """The same, from a config file as `serve deploy` would read it."""
    path = tmp_path / "bad.yaml"
    config = yaml.safe_load((REPO / "serve_configs" / "tiny_omni.yaml").read_text())
    config["applications"][0]["args"]["code2wav"]["dtype"] = "int8"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValidationError, match=r"code2wav\.dtype"):
        OmniServingArgs.model_validate(load_args(path))


def test_missing_checkpoint_is_named_at_load():
    args = OmniServingArgs.model_validate({"model": "/nonexistent/qwen3-omni",
                                           "make_tiny_if_missing": False})
    with pytest.raises(FileNotFoundError, match="model: no checkpoint directory"):
        args.checkpoint_dir()


# -- builder: deployment_options ------------------------------------------------------------------
@pytest.mark.parametrize("stage, prefix", [("thinker", "Thinker"), ("talker", "Talker"),
                                           ("code2wav", "Code2Wav")])
def test_deployment_names_are_prefixed(stage, prefix):
    opts = deployment_options(stage, StageConfig(), "qwen3-omni")
    assert opts["name"] == stage_deployment_name(stage, "qwen3-omni") == f"{prefix}:qwen3-omni"


def test_deployment_config_passes_through():
    cfg = StageConfig(deployment_config={"num_replicas": 3, "max_ongoing_requests": 7,
                                         "max_queued_requests": 11,
                                         "graceful_shutdown_timeout_s": 300})
    opts = deployment_options("talker", cfg, "m")
    assert (opts["num_replicas"], opts["max_ongoing_requests"], opts["max_queued_requests"],
            opts["graceful_shutdown_timeout_s"]) == (3, 7, 11, 300)


def test_defaults_without_deployment_config():
    opts = deployment_options("thinker", StageConfig(max_num_seqs=16), "m")
    assert opts["num_replicas"] == 1
    assert opts["max_ongoing_requests"] == 64 and opts["max_queued_requests"] == 128
    assert opts["ray_actor_options"] == {"num_cpus": 0}
    assert "placement_group_bundles" not in opts  # no GPU, no custom resources: no bundles


def test_autoscaling_config_replaces_num_replicas():
    autoscaling = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}
    opts = deployment_options("code2wav", StageConfig(
        deployment_config={"autoscaling_config": autoscaling}), "m")
    assert opts["autoscaling_config"] == autoscaling
    assert "num_replicas" not in opts


def test_ray_actor_options_are_merged():
    cfg = StageConfig(deployment_config={
        "ray_actor_options": {"runtime_env": {"env_vars": {"A": "1"}}, "memory": 1 << 30}})
    opts = deployment_options("talker", cfg, "m")
    assert opts["ray_actor_options"] == {"num_cpus": 0, "runtime_env": {"env_vars": {"A": "1"}},
                                         "memory": 1 << 30}


def test_gpu_stage_gets_placement_group_with_gpu_in_bundle_1():
    cfg = StageConfig(engine_resources=EngineResources(num_cpus=4, num_gpus=0.5,
                                                       resources={"speech_gpu": 0.5}))
    opts = deployment_options("talker", cfg, "m")
    replica, engine = opts["placement_group_bundles"]
    assert "GPU" not in replica  # the replica is a light async front
    assert engine == {"CPU": 4, "GPU": 0.5, "speech_gpu": 0.5}
    assert opts["placement_group_strategy"] == "STRICT_PACK"  # engine beside its replica
    assert opts["ray_actor_options"]["num_cpus"] == replica["CPU"]


def test_user_placement_group_bundles_are_kept():
    bundles = [{"CPU": 1}, {"CPU": 1, "GPU": 1}, {"GPU": 1}]
    cfg = StageConfig(engine_resources=EngineResources(num_gpus=1),
                      deployment_config={"placement_group_bundles": bundles,
                                         "placement_group_strategy": "PACK"})
    opts = deployment_options("thinker", cfg, "m")
    assert opts["placement_group_bundles"] == bundles
    assert opts["placement_group_strategy"] == "PACK"


def test_production_placement(tmp_path):
    """qwen3_omni.yaml: each engine bundle holds its GPU share and its node-group resource."""
    args = validate(load_args(REPO / "serve_configs" / "qwen3_omni.yaml"), tmp_path)
    engines = {stage: deployment_options(stage, getattr(args, stage),
                                         args.model_id)["placement_group_bundles"][1]
               for stage in STAGES}
    assert engines["thinker"]["GPU"] == 1 and engines["thinker"]["thinker_gpu"] == 1
    assert engines["talker"]["GPU"] == engines["code2wav"]["GPU"] == 0.5
    assert engines["talker"]["speech_gpu"] == engines["code2wav"]["speech_gpu"] == 0.5


def test_a_stage_given_without_default_sampling_keeps_the_stage_default():
    """`talker: {backend: vllm}` must not silently drop the talker's repetition penalty."""
    from omni_ray.config.sampling import TALKER_GREEDY, THINKER_GREEDY

    args = OmniServingArgs.model_validate({"model": "/m", "talker": {"device": "cpu"},
                                           "thinker": {"max_num_seqs": 4}})
    assert args.talker.default_sampling == TALKER_GREEDY
    assert args.thinker.default_sampling == THINKER_GREEDY


def test_mistyped_checkpoint_fails_the_deploy_not_random_weights(tmp_path):
    """A path that does not exist is an error when the app is built (no tiny stand-in unless
    asked for by name or with make_tiny_if_missing)."""
    from omni_ray.builders.app import build_omni_app

    missing = tmp_path / "Qwen3-Omni-30B-A3B-Instuct"
    with pytest.raises(FileNotFoundError, match="model: no checkpoint directory"):
        build_omni_app({"model": str(missing)})
    assert not missing.exists()


def test_mps_settings_are_the_engine_actors_environment():
    """``engine_resources.mps_*`` -> the variables MPS reads in the engine's process (the
    stage server passes them as the engine actor's runtime_env; ``/debug/stats`` shows them)."""
    assert EngineResources().env_vars() == {}
    assert EngineResources(mps_sm_percent=50).env_vars() == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    assert EngineResources(mps_low_priority=True).env_vars() == {"CUDA_MPS_CLIENT_PRIORITY": "1"}
    one_gpu = yaml.safe_load((REPO / "serve_configs" / "qwen3_omni_1gpu.yaml").read_text())
    args = OmniServingArgs.model_validate(one_gpu["applications"][0]["args"])
    assert args.thinker.engine_resources.env_vars() == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    assert args.talker.engine_resources.env_vars() == {} == args.code2wav.engine_resources.env_vars()


def test_a_running_engine_changes_only_its_mps_settings():
    """``EngineResources.with_mps``: what ``POST /debug/engines`` may replace an engine with."""
    res = EngineResources(num_gpus=0.3, mps_sm_percent=50)
    new = res.with_mps({"mps_sm_percent": 70, "mps_low_priority": True})
    assert (new.num_gpus, new.mps_sm_percent, new.mps_low_priority) == (0.3, 70, True)
    assert res.with_mps({"mps_sm_percent": None}).env_vars() == {}
    with pytest.raises(ValueError, match="^num_gpus: only mps_sm_percent, mps_low_priority"):
        res.with_mps({"num_gpus": 1})
    with pytest.raises(ValidationError, match="mps_sm_percent"):
        res.with_mps({"mps_sm_percent": 0})
