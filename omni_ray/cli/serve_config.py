"""``--config FILE``: a Serve config YAML (``serve run`` / RayService format) read as
``build_omni_app`` args plus HTTP options, with command-line flags layered on top.

The first application's ``args`` are the app's args; ``http_options`` the host and port. Flags
given on the command line override them (``deep_merge``), and ``OmniServingArgs`` validates the
result once, as Serve would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ServeFile:
    args: dict[str, Any] = field(default_factory=dict)          # the app's build_omni_app args
    http_options: dict[str, Any] = field(default_factory=dict)  # host, port, ...
    name: str = "omni"
    route_prefix: str = "/"


def read_serve_config(path: Path | None) -> ServeFile:
    """The first application of the Serve config at ``path`` (empty for None)."""
    if path is None:
        return ServeFile()
    import yaml

    doc = yaml.safe_load(Path(path).read_text()) or {}
    apps = doc.get("applications") if isinstance(doc, dict) else None
    if not apps or not isinstance(apps, list):
        raise ValueError(f"{path}: not a Serve config (no 'applications' list)")
    app = apps[0]
    return ServeFile(args=dict(app.get("args") or {}),
                     http_options=dict(doc.get("http_options") or {}),
                     name=app.get("name", "omni"), route_prefix=app.get("route_prefix", "/"))


def deep_merge(base: dict, override: dict) -> dict:
    """``base`` with ``override`` laid over it, nested dicts merged key by key; None values in
    ``override`` (flags not given) leave ``base`` alone."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, dict):
            out[key] = deep_merge({}, value)
        else:
            out[key] = value
    return {k: v for k, v in out.items() if v != {} or k in base}


def add_app_flags(p, model: bool = False) -> None:
    """The flags ``serve``, ``generate``, ``speak`` and ``batch`` share: what to load, and how
    (each overrides the config file's args; left out, the file's value or the app's default
    holds). ``model``: a ``--model`` flag too (``serve`` takes the model positionally)."""
    if model:
        p.add_argument("--model", default=None,
                       help="checkpoint directory, Hugging Face hub id, or 'tiny' (default: the "
                            "config's model, else the tiny checkpoint in $OMNI_RAY_HOME: random "
                            "weights)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="a Serve config YAML (e.g. serve_configs/tiny_omni.yaml): its first "
                        "application's args, then these flags")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit of the model")
    p.add_argument("--thinker-backend", choices=("transformers", "vllm"), default=None)
    p.add_argument("--talker-backend", choices=("transformers", "vllm"), default=None)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N for every stage")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="weights dtype of every stage")
    p.add_argument("--allow-dummy-weights", action="store_true", default=None,
                   help="load an omni-ray make-dummy stand-in (random weights)")


def app_overrides(ns) -> dict[str, Any]:
    """The ``build_omni_app`` args the shared flags set (None: not given)."""
    stage = {"device": ns.device, "dtype": ns.dtype}
    return {"model": ns.model, "revision": ns.revision,
            "allow_dummy_weights": ns.allow_dummy_weights,
            "thinker": {**stage, "backend": ns.thinker_backend},
            "talker": {**stage, "backend": ns.talker_backend},
            "code2wav": dict(stage)}


def serving_args(ns, extra: dict[str, Any] | None = None):
    """``OmniServingArgs`` from ``--config`` with the flags (and ``extra``) over it; also the
    file's HTTP options. ValueError (file or validation) names the problem."""
    from pydantic import ValidationError

    from omni_ray.config.serving import OmniServingArgs

    sf = read_serve_config(ns.config)
    merged = deep_merge(deep_merge(sf.args, app_overrides(ns)), extra or {})
    try:
        return OmniServingArgs.model_validate(merged), sf
    except ValidationError as e:
        raise ValueError(str(e)) from None
