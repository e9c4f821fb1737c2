"""Dummy checkpoints (``omni-ray make-dummy``): released config values, real-size parameter
counts, seeded random stages, the offline pipeline, the CLI and the serving guard."""

from __future__ import annotations

import json

import pytest
import torch

from omni_ray.models.dummy import (
    MARKER,
    build_dummy_stage,
    dummy_info,
    is_dummy_checkpoint,
    make_dummy_checkpoint,
    shape_config_dict,
)
from omni_ray.models.loading import STAGES, load_omni_config, load_stage


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory):
    return make_dummy_checkpoint(tmp_path_factory.mktemp("real") / "ckpt", processor=False)


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    return make_dummy_checkpoint(tmp_path_factory.mktemp("smoke") / "ckpt", shape="smoke",
                                 seed=0)


def test_real_shape_has_the_released_config_values(real_dir):
    cfg = load_omni_config(real_dir)  # loads with transformers' own config class
    th, tk, cw = cfg.thinker_config, cfg.talker_config, cfg.code2wav_config
    t = th.text_config
    assert (t.num_hidden_layers, t.hidden_size, t.num_experts, t.num_experts_per_tok,
            t.vocab_size) == (48, 2048, 128, 8, 152064)
    assert (t.num_attention_heads, t.num_key_value_heads, t.head_dim,
            t.moe_intermediate_size) == (32, 4, 128, 768)
    assert t.rope_parameters["mrope_section"] == [24, 20, 20]
    a = th.audio_config
    assert (a.d_model, a.encoder_layers, a.encoder_attention_heads, a.encoder_ffn_dim,
            a.output_dim, a.downsample_hidden_size, a.num_mel_bins) == (
        1280, 32, 20, 5120, 2048, 480, 128)
    v = th.vision_config
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.patch_size,
            v.out_hidden_size, list(v.deepstack_visual_indexes)) == (
        27, 1152, 4304, 16, 16, 2048, [8, 16, 24])
    assert tk.accept_hidden_layer == 24 and tk.num_code_groups == 16
    assert tk.thinker_hidden_size == 2048
    assert (tk.codec_pad_id, tk.codec_bos_id, tk.codec_eos_token_id) == (2148, 2149, 2150)
    assert (tk.codec_nothink_id, tk.codec_think_bos_id, tk.codec_think_eos_id) == (
        2155, 2156, 2157)
    assert dict(tk.speaker_id) == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert tk.position_id_per_seconds == 13
    tt = tk.text_config
    assert (tt.vocab_size, tt.hidden_size, tt.num_hidden_layers, tt.num_experts,
            tt.num_experts_per_tok, tt.moe_intermediate_size,
            tt.shared_expert_intermediate_size) == (3072, 1024, 20, 128, 6, 384, 768)
    cp = tk.code_predictor_config
    assert (cp.vocab_size, cp.hidden_size, cp.num_hidden_layers) == (2048, 1024, 5)
    assert (cw.num_quantizers, cw.codebook_size, cw.hidden_size, cw.num_hidden_layers,
            cw.sliding_window, cw.decoder_dim) == (16, 2048, 1024, 8, 72, 1536)
    assert list(cw.upsample_rates) == [8, 5, 4, 3] and list(cw.upsampling_ratios) == [2, 2]
    assert (cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id) == (
        151671, 151672, 151673)
    assert (cfg.im_start_token_id, cfg.im_end_token_id, cfg.assistant_token_id,
            cfg.user_token_id, cfg.system_token_id) == (151644, 151645, 77091, 872, 8948)


def test_real_shape_parameter_counts(real_dir):
    """Built on the meta device (no memory): thinker ~31.7B with its encoders (audio ~0.65B,
    vision ~0.54B), talker ~3.3B, code2wav ~0.2B; ~35.3B in all, as the released safetensors."""
    cfg = load_omni_config(real_dir)
    counts, parts = {}, {}
    for stage in STAGES:
        module, emb = build_dummy_stage(cfg, stage, "meta")
        counts[stage] = sum(p.numel() for p in module.parameters())
        if stage == "thinker":
            for name, p in module.named_parameters():
                key = ("audio" if "audio_tower" in name else
                       "vision" if "visual" in name else "text")
                parts[key] = parts.get(key, 0) + p.numel()
        if stage == "talker":
            assert tuple(emb.weight.shape) == (152064, 2048)
    assert 30.5e9 < counts["thinker"] < 32.5e9
    assert 0.6e9 < parts["audio"] < 0.7e9 and 0.5e9 < parts["vision"] < 0.6e9
    assert 3.0e9 < counts["talker"] < 3.6e9
    assert 0.15e9 < counts["code2wav"] < 0.25e9
    assert 34.5e9 < sum(counts.values()) < 36e9


def test_half_thinker_shape_halves_the_thinker_only(tmp_path):
    """The H100-sized stand-in: 24 thinker layers (~16B with its encoders), the talker tapping
    layer 12 of them, the speech stages as released."""
    d = make_dummy_checkpoint(tmp_path / "h", shape="qwen3-omni-30b-a3b-half-thinker",
                              processor=False)
    cfg, real = load_omni_config(d), shape_config_dict()
    assert cfg.thinker_config.text_config.num_hidden_layers == 24
    assert cfg.talker_config.accept_hidden_layer == 12
    half = shape_config_dict("qwen3-omni-30b-a3b-half-thinker")
    assert half["code2wav_config"] == real["code2wav_config"]
    assert half["talker_config"] == {**real["talker_config"], "accept_hidden_layer": 12}
    module, _ = build_dummy_stage(cfg, "thinker", "meta")
    assert 15e9 < sum(p.numel() for p in module.parameters()) < 17.5e9


def test_checkpoint_layout_and_marker(tmp_path, tiny_model_dir):
    d = make_dummy_checkpoint(tmp_path / "d", shape="smoke", seed=7, processor=False)
    assert not list(d.glob("*.safetensors"))
    assert json.loads((d / MARKER).read_text()) == {"shape": "smoke", "seed": 7,
                                                    "note": "random weights"}
    assert is_dummy_checkpoint(d) and dummy_info(d)["seed"] == 7
    assert (d / "tokenizer.json").exists() and not (d / "processor_config.json").exists()
    assert json.loads((d / "config.json").read_text()) == shape_config_dict("smoke")
    assert not is_dummy_checkpoint(tiny_model_dir) and dummy_info(tiny_model_dir) is None
    with pytest.raises(ValueError, match="shape"):
        shape_config_dict("70b")


def test_smoke_shape_is_vllm_cpu_friendly():
    cfg = shape_config_dict("smoke")
    for text in (cfg["thinker_config"]["text_config"], cfg["talker_config"]["text_config"]):
        assert text["head_dim"] == 64
        assert sum(text["rope_parameters"]["mrope_section"]) == 32
        assert text["hidden_size"] == text["num_attention_heads"] * text["head_dim"]
    assert cfg["talker_config"]["thinker_hidden_size"] == cfg["thinker_config"]["text_config"][
        "hidden_size"]


def _params(stage_modules) -> dict:
    out = {k: v.detach().clone() for k, v in stage_modules.module.state_dict().items()}
    if stage_modules.text_embedding is not None:
        out["<text_embedding>"] = stage_modules.text_embedding.weight.detach().clone()
    return out


def test_smoke_stages_load_deterministically(smoke_dir, tmp_path):
    other = make_dummy_checkpoint(tmp_path / "seed1", shape="smoke", seed=1, processor=False)
    first = {}
    for stage in STAGES:
        a, b = load_stage(smoke_dir, stage), load_stage(smoke_dir, stage)
        c = load_stage(other, stage)
        pa, pb, pc = _params(a), _params(b), _params(c)
        assert pa.keys() == pb.keys() == pc.keys()
        assert all(torch.isfinite(v).all() for v in pa.values() if v.is_floating_point())
        assert all(torch.equal(pa[k], pb[k]) for k in pa), stage  # same seed: same weights
        assert any(not torch.equal(pa[k], pc[k]) for k in pa), stage  # other seed: others
        first[stage] = a
    assert first["talker"].text_embedding is not None and first["thinker"].text_embedding is None
    # The talker stage's thinker embedding table is the thinker stage's own.
    assert torch.equal(first["talker"].text_embedding.weight,
                       first["thinker"].module.get_input_embeddings().weight)
    experts = [p for n, p in first["talker"].module.named_parameters() if "experts" in n]
    assert experts and all(p.abs().max() < 1 for p in experts)  # re-initialised, not empty


def test_offline_pipeline_on_a_smoke_dummy(smoke_dir):
    from omni_ray.config.request import OmniRequest
    from omni_ray.offline import Omni

    omni = Omni(smoke_dir, mode="async_chunk")
    req = OmniRequest(request_id="d", prompt_token_ids=omni.prompt_ids("Hi"), max_tokens=6,
                      max_audio_frames=10)
    out = omni.generate(req)[0]
    assert out.error is None and len(out.text_token_ids) == 6 and out.text
    assert out.codec_frames.shape == (10, 16)
    assert out.audio.numel() > 0 and torch.isfinite(out.audio).all()
    again = omni.generate(req)[0]
    assert again.text_token_ids == out.text_token_ids and torch.equal(again.audio, out.audio)


def test_cli_make_dummy(tmp_path, capsys):
    from omni_ray.cli import main

    assert main(["make-dummy", str(tmp_path / "c"), "--shape", "smoke", "--seed", "3",
                 "--no-processor"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c")
    assert dummy_info(tmp_path / "c") == {"shape": "smoke", "seed": 3, "note": "random weights"}
    assert main(["make-dummy", str(tmp_path / "r"), "--no-processor"]) == 0
    assert dummy_info(tmp_path / "r")["shape"] == "qwen3-omni-30b-a3b"
    with pytest.raises(SystemExit) as e:
        main(["make-dummy", str(tmp_path / "x"), "--shape", "huge"])
    assert e.value.code == 2


def test_serving_args_refuse_a_dummy_unless_allowed(smoke_dir, tiny_model_dir, caplog):
    from omni_ray.config.serving import OmniServingArgs

    with pytest.raises(ValueError, match="allow_dummy_weights"):
        OmniServingArgs(model=str(smoke_dir)).checkpoint_dir()
    args = OmniServingArgs(model=str(smoke_dir), allow_dummy_weights=True)
    with caplog.at_level("WARNING", logger="ray.serve"):
        assert args.checkpoint_dir() == str(smoke_dir)
    assert any("serving RANDOM weights" in r.getMessage() for r in caplog.records)
    # Real (seeded, saved) weights are not a dummy: no flag needed.
    assert OmniServingArgs(model=tiny_model_dir).checkpoint_dir() == tiny_model_dir
