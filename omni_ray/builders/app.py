"""``build_omni_app(args)``: the Serve application (ingress + three stage deployments).

Used as ``import_path: omni_ray:build_omni_app`` with ``args:`` in a Serve config, or from Python.
Deployment classes stay undecorated; this module applies ``serve.deployment`` with defaults merged
with the user's ``deployment_config`` in one place (``deployment_options``). Names are prefixed per
stage: ``Thinker:<model_id>``, ``Talker:<model_id>``, ``Code2Wav:<model_id>``, ``OmniIngress``.
With ``thinker_disaggregation`` enabled, ``ThinkerPrefill:<model_id>`` and
``ThinkerDecode:<model_id>`` replace ``Thinker:<model_id>`` (docs/kv_transfer.md).
"""

from __future__ import annotations

from typing import Any

from omni_ray.config.serving import OmniServingArgs, StageConfig

STAGE_NAMES = {"thinker": "Thinker", "talker": "Talker", "code2wav": "Code2Wav",
               "thinker_prefill": "ThinkerPrefill", "thinker_decode": "ThinkerDecode"}
# Full queues answer 503 with ``Retry-After: 1``: Serve's proxy for the ingress itself, the
# ingress (OpenAI error body) for a stage (see docs/faults.md).
BACKPRESSURE = {"status_code": 503, "retry_after_s": 1}


def stage_deployment_name(stage: str, model_id: str) -> str:
    return f"{STAGE_NAMES[stage]}:{model_id}"


def deployment_options(stage: str, cfg: StageConfig, model_id: str) -> dict[str, Any]:
    """Serve options of one stage: our defaults, then the user's ``deployment_config``."""
    opts: dict[str, Any] = {
        "name": stage_deployment_name(stage, model_id),
        "num_replicas": 1,
        "max_ongoing_requests": 4 * cfg.max_num_seqs,
        "max_queued_requests": 8 * cfg.max_num_seqs,
        "health_check_period_s": 10,
        "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": 120,  # above the longest audio stream
        "backpressure_config": dict(BACKPRESSURE),
        "ray_actor_options": {"num_cpus": 0},
    }
    user = dict(cfg.deployment_config)
    if "ray_actor_options" in user:
        opts["ray_actor_options"] = {**opts["ray_actor_options"], **user.pop("ray_actor_options")}
    if "autoscaling_config" in user:
        opts.pop("num_replicas")
    opts.update(user)
    res = cfg.engine_resources
    if "placement_group_bundles" not in opts and (res.num_gpus or res.resources):
        # The engine actor (bundle 1) lands on the replica's node with the stage's resources.
        replica = {"CPU": float(opts["ray_actor_options"].get("num_cpus", 0)) or 0.001}
        engine = {"CPU": res.num_cpus or 0.001, **({"GPU": res.num_gpus} if res.num_gpus else {}),
                  **res.resources}
        opts["placement_group_bundles"] = [replica, engine]
        opts["placement_group_strategy"] = "STRICT_PACK"
        opts["ray_actor_options"] = {**opts["ray_actor_options"],
                                     "num_cpus": replica["CPU"]}
    return opts


def ingress_options(args: OmniServingArgs) -> dict[str, Any]:
    opts: dict[str, Any] = {"name": "OmniIngress", "num_replicas": 1,
                            "max_ongoing_requests": 256, "max_queued_requests": 512,
                            "backpressure_config": dict(BACKPRESSURE),
                            "ray_actor_options": {"num_cpus": 0}}
    user = dict(args.ingress_deployment_config)
    if "ray_actor_options" in user:
        opts["ray_actor_options"] = {**opts["ray_actor_options"], **user.pop("ray_actor_options")}
    opts.update(user)
    return opts


def build_omni_app(args: dict | OmniServingArgs | None = None):
    """Validate ``args`` and return the bound Serve application."""
    from ray import serve

    from omni_ray.ingress.app import OmniIngress, app
    from omni_ray.stages.server import STAGE_SERVERS

    args = OmniServingArgs.model_validate(args or {})
    args.checkpoint_dir()  # deploy time: a missing checkpoint (or unallowed stand-in) fails here
    # Python-mode dumps keep api_keys as SecretStr (masked wherever Serve prints init args); the
    # stages never see them at all.
    dump = args.model_dump()
    stage_dump = args.model_dump(exclude={"security": {"api_keys"}})
    servers = dict(STAGE_SERVERS)
    if args.disaggregated:  # ThinkerPrefill + ThinkerDecode instead of Thinker
        from omni_ray.stages.kv_server import KV_STAGE_SERVERS

        del servers["thinker"]
        servers.update(KV_STAGE_SERVERS)
    bound = {}
    for stage, cls in servers.items():
        opts = deployment_options(stage, cls.stage_config(args), args.model_id)
        bound[stage] = serve.deployment(cls, **opts).bind(stage_dump)
    ingress_cls = serve.ingress(app)(OmniIngress)
    extra = {"thinker_prefill": bound["thinker_prefill"]} if args.disaggregated else {}
    return serve.deployment(ingress_cls, **ingress_options(args)).bind(
        bound.get("thinker_decode", bound.get("thinker")), bound["talker"], bound["code2wav"],
        dump, **extra)
