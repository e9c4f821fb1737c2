"""The checkpoint directory vLLM loads as the talker's backbone: one per checkpoint, kept.

vLLM runs the talker's Qwen3-MoE backbone from a directory of its own: a Qwen3-MoE
``config.json`` made from the talker's text config, and links to the checkpoint's safetensors
files that hold ``talker.*`` weights (the model's ``load_weights`` keeps only those).

That directory is the same on every start from the same checkpoint (``OMNI_RAY_HOME``/
``vllm_talker/<key>``, the key a hash of the checkpoint's path and the config written). vLLM keys
its compile cache by the model path, and the talker's code predictor compiles into the inductor
cache vLLM points the process at (``TORCHINDUCTOR_CACHE_DIR``): with a fresh temporary directory
per start, every start compiled both again (session 19 on an H100: the talker's graph 18 s and
the code predictor's warm-up 102 s, in each of two starts on one machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from omni_ray.constants import OMNI_RAY_HOME

ROOT = OMNI_RAY_HOME / "vllm_talker"
INDEX = "model.safetensors.index.json"
# Qwen3-MoE config fields vLLM reads, copied from the talker's text config.
_BACKBONE_FIELDS = (
    "hidden_size", "intermediate_size", "moe_intermediate_size", "num_experts_per_tok",
    "norm_topk_prob", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act",
    "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
    "attention_bias",
)


def backbone_dir(model_dir: str | os.PathLike, root: Path | None = None) -> Path:
    """The talker backbone's directory for the checkpoint at ``model_dir``: made the first
    time, then reused as long as it is intact (its config and links as they would be written
    now). Starts racing to make it (two talker replicas) end with the same directory."""
    model_dir = Path(model_dir).resolve()
    files = _contents(model_dir)
    key = hashlib.sha256(json.dumps([str(model_dir), files], sort_keys=True).encode()
                         ).hexdigest()[:16]
    root = Path(root or ROOT)
    out = root / key
    if _intact(out, model_dir, files):
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    _write(tmp, model_dir, files)
    if _intact(out, model_dir, files):  # another start made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    if out.exists():  # broken (a link gone, a file edited): replaced
        shutil.rmtree(out, ignore_errors=True)
    try:
        tmp.rename(out)
    except OSError:  # another start made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        if not _intact(out, model_dir, files):
            raise
    return out


def _contents(model_dir: Path) -> dict:
    """What the directory holds: {"config.json": dict, INDEX: dict or None, "links": [names]}."""
    from omni_ray.models.vllm_plugin import TALKER_ARCHITECTURE

    full = json.loads((model_dir / "config.json").read_text())
    text = full["talker_config"]["text_config"]
    cfg = {k: text[k] for k in _BACKBONE_FIELDS if k in text}
    rope = text.get("rope_parameters") or {}
    theta = rope.get("rope_theta", text.get("rope_theta", 1e6))
    cfg.update(
        architectures=[TALKER_ARCHITECTURE], model_type="qwen3_moe",
        num_experts=text.get("num_experts", text.get("num_local_experts")),
        rope_parameters={**rope, "rope_type": rope.get("rope_type", "default"),
                         "rope_theta": theta}, rope_theta=theta,
        tie_word_embeddings=False, dtype=full.get("dtype") or "float32",
    )
    index = model_dir / INDEX
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        wm = {k: v for k, v in wm.items() if k.startswith("talker.")}
        return {"config.json": cfg, INDEX: {"metadata": {}, "weight_map": wm},
                "links": sorted(set(wm.values()))}
    return {"config.json": cfg, INDEX: None,
            "links": sorted(p.name for p in model_dir.glob("*.safetensors"))}


def _write(out: Path, model_dir: Path, files: dict) -> None:
    (out / "config.json").write_text(json.dumps(files["config.json"], indent=2))
    if files[INDEX] is not None:
        (out / INDEX).write_text(json.dumps(files[INDEX]))
    for name in files["links"]:
        (out / name).symlink_to((model_dir / name).resolve())


def _intact(out: Path, model_dir: Path, files: dict) -> bool:
    try:
        if json.loads((out / "config.json").read_text()) != files["config.json"]:
            return False
        index = out / INDEX
        if (json.loads(index.read_text()) if index.exists() else None) != files[INDEX]:
            return False
        return all((out / n).is_symlink() and (out / n).resolve() == (model_dir / n).resolve()
                   for n in files["links"])
    except (OSError, ValueError):
        return False
