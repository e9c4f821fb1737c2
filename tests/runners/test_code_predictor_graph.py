"""The static (CUDA-graph-ready) code predictor == transformers' code predictor, greedy.

runners/transformers/code_predictor_graph.py rewrites the 15-step loop with static shapes so it can be
captured; here (CPU, eager) it must pick the same codes and the same summed embedding as
``TalkerInputs.residual_codes_batch`` on transformers' module. The capture itself only runs on
CUDA (benchmarks/gpu_run.py exercises it; ``test_a_replayed_frame_equals_the_eager_frame_on_cuda``
on a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.runners.transformers.code_predictor_graph import CodePredictorGraphs, static_codes
from omni_ray.runners.transformers.talker_inputs import TalkerInputs, TalkerSeq


@pytest.fixture(scope="module")
def talker_parts(tiny_model_dir):
    from omni_ray.models.loading import load_stage

    return load_stage(tiny_model_dir, "talker")


def _deeper(talker):
    """The tiny talker with a 3-layer code predictor (random layers): covers the layer loop."""
    from transformers import Qwen3OmniMoeTalkerForConditionalGeneration

    cfg = copy.deepcopy(talker.config)
    cfg.code_predictor_config.num_hidden_layers = 3
    cfg.code_predictor_config.layer_types = ["full_attention"] * 3
    torch.manual_seed(1)
    deeper = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(cfg).eval()
    with torch.no_grad():
        for p in deeper.parameters():
            if not torch.isfinite(p).all():
                p.normal_(0, 0.02)
    return deeper


@pytest.mark.parametrize("fused", [False, True], ids=["own-gemms", "fused-gemms"])
@pytest.mark.parametrize("deep", [False, True], ids=["tiny", "3-layer"])
@pytest.mark.parametrize("batch", [1, 5])
@torch.inference_mode()
def test_static_code_predictor_equals_transformers(talker_parts, deep, batch, fused):
    """... with transformers' own q/k/v and gate/up projections, and with them fused
    (``FusedLayer``: what the CUDA graphs run by default, ``StageConfig.fused_code_predictor``)."""
    from omni_ray.runners.transformers.code_predictor_graph import fused_layers

    talker = _deeper(talker_parts.module) if deep else talker_parts.module
    inputs = TalkerInputs(talker, talker_parts.text_embedding, talker_parts.config)
    gen = torch.Generator().manual_seed(batch)
    hidden = talker.config.text_config.hidden_size
    seqs = []
    for i in range(batch):
        s = TalkerSeq(f"r{i}", 2301, SamplingParams(), 10, None)
        s.past_hidden = torch.randn(1, 1, hidden, generator=gen)
        s.codec_ids = [int(torch.randint(0, 2048, (1,), generator=gen))]
        seqs.append(s)
    ref = inputs.residual_codes_batch(seqs)
    cp = talker.code_predictor.model.config
    kv = [(torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim),
           torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim))
          for _ in range(cp.num_hidden_layers)]
    codes, embed_sum = static_codes(talker, torch.cat([s.past_hidden for s in seqs]),
                                    torch.tensor([s.codec_ids[-1] for s in seqs]), kv,
                                    layers=fused_layers(talker) if fused else None)
    for i, s in enumerate(seqs):
        frame, emb = ref[s.request_id]
        assert torch.equal(codes[i:i + 1], frame)
        torch.testing.assert_close(embed_sum[i:i + 1], emb, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@torch.inference_mode()
def test_the_steps_rotary_tables_give_the_same_frame_without_their_operators(talker_parts,
                                                                            sample):
    """``rope_steps``' tables, made once (the CUDA graphs take them as inputs), give the codes
    and the summed embedding of the rotary computed step by step, bitwise; the frame then runs
    none of the rotary's operators (15 steps x arange, cos, sin, ... before)."""
    from benchmarks.op_count import OpCount
    from omni_ray.runners.transformers.code_predictor_graph import rope_steps

    talker = _deeper(talker_parts.module)
    cp = talker.code_predictor.model.config
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 1, talker.config.text_config.hidden_size, generator=gen)
    code0 = torch.randint(0, 2048, (4,), generator=gen)
    tables = rope_steps(talker, hidden)
    runs = []
    for rope in (None, tables):
        kv = [(torch.zeros(4, cp.num_key_value_heads, 16, cp.head_dim),
               torch.zeros(4, cp.num_key_value_heads, 16, cp.head_dim))
              for _ in range(cp.num_hidden_layers)]
        torch.manual_seed(0)  # the sampled codes' draws
        with OpCount() as ops:
            runs.append((*static_codes(talker, hidden, code0, kv, sample, rope=rope), ops))
    (codes, emb, per_step), (codes_t, emb_t, once) = runs
    assert torch.equal(codes, codes_t) and torch.equal(emb, emb_t)
    assert per_step.by_op["cos"] == per_step.by_op["sin"] == per_step.by_op["arange"] == 15
    assert once.by_op["cos"] == once.by_op["sin"] == once.by_op["arange"] == 0
    assert once.total < per_step.total


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("batch", [1, 4, 8])  # bucket sizes: the same GEMM shapes as eager
@torch.inference_mode()
def test_a_replayed_frame_equals_the_eager_frame_on_cuda(talker_parts, batch):
    """The captured graph (fused GEMMs, the steps' rotary tables as inputs) replays the frame
    the eager ``static_codes`` makes step by step: the same codes, the same summed embedding
    (float32, greedy)."""
    talker = _deeper(talker_parts.module).cuda()
    graphs = CodePredictorGraphs(talker, "cuda", torch.float32, fuse=True)
    cp = talker.code_predictor.model.config
    gen = torch.Generator(device="cuda").manual_seed(batch)
    hidden = torch.randn(batch, 1, talker.config.text_config.hidden_size, device="cuda",
                         generator=gen)
    code0 = torch.randint(0, 2048, (batch,), device="cuda", generator=gen)
    codes, emb = graphs(hidden, code0)
    graphs(hidden * 2, code0.flip(0))  # another replay in between: nothing carried over
    again, emb_again = graphs(hidden, code0)
    kv = [(torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim, device="cuda"),
           torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim, device="cuda"))
          for _ in range(cp.num_hidden_layers)]
    ref, ref_emb = static_codes(talker, hidden, code0, kv, layers=graphs.fused)
    assert torch.equal(codes, ref) and torch.equal(again, ref)
    torch.testing.assert_close(emb, ref_emb, atol=1e-6, rtol=1e-6)
    assert torch.equal(emb, emb_again)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@torch.inference_mode()
def test_a_replayed_compiled_head_draws_what_the_eager_head_draws_on_cuda(talker_parts):
    """The compiled ``head_step`` captured in the graphs (the GPU default with compile_graphs)
    samples the codes the eager head samples in the same graphs: the replays are seeded alike,
    and the Exp(1) variates are drawn outside the head, so both read the same ones (float32)."""
    from omni_ray.runners.transformers.code_predictor_graph import head_step

    talker = _deeper(talker_parts.module).cuda()
    eager = CodePredictorGraphs(talker, "cuda", torch.float32, fuse=True)
    compiled = CodePredictorGraphs(talker, "cuda", torch.float32, fuse=True)
    compiled.head = torch.compile(head_step, dynamic=True, fullgraph=True)
    for batch in (1, 4):
        gen = torch.Generator(device="cuda").manual_seed(batch)
        hidden = torch.randn(batch, 1, talker.config.text_config.hidden_size, device="cuda",
                             generator=gen)
        code0 = torch.randint(0, 2048, (batch,), device="cuda", generator=gen)
        got = []
        for graphs in (eager, compiled):
            graphs(hidden, code0, sample=True)  # captured at the first call
            torch.manual_seed(100 + batch)
            got.append(graphs(hidden, code0, sample=True))
        assert compiled.head is not head_step  # no fallback to the eager head
        assert torch.equal(got[0][0], got[1][0])
        torch.testing.assert_close(got[0][1], got[1][1], atol=1e-5, rtol=1e-5)


def test_graphs_are_off_on_cpu_and_refuse_to_capture_without_cuda(talker_parts):
    inputs = TalkerInputs(talker_parts.module, talker_parts.text_embedding, talker_parts.config)
    assert inputs.cp_graphs is None
    graphs = CodePredictorGraphs(talker_parts.module, "cpu", torch.float32)
    with pytest.raises((RuntimeError, AssertionError, AttributeError)):
        graphs(torch.zeros(1, 1, 32), torch.zeros(1, dtype=torch.long))


def test_top_k_top_p_keeps_what_sample_token_keeps():
    """The graph's filter == runners.sampling.sample_token's (top-k 50, then top-p 0.8), on
    float32 logits and on bf16-rounded ones (ties)."""
    from omni_ray.runners.transformers.code_predictor_graph import top_k_top_p

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 2048, generator=gen) * 3
    logits = torch.cat([logits, logits.bfloat16().float()])  # bf16 heads: ties at the 50th
    got = torch.isfinite(top_k_top_p(logits))
    for row in range(logits.shape[0]):
        scores = logits[row].clone()  # sample_token's steps, temperature 1
        kth = torch.topk(scores, 50).values[-1]
        scores[scores < kth] = float("-inf")
        sorted_scores, order = torch.sort(scores, descending=False)
        remove = sorted_scores.softmax(-1).cumsum(-1) <= 0.2
        remove[-1] = False
        scores[order[remove]] = float("-inf")
        # the same values kept; of codes tied at the top-p edge, which goes is either's sort's
        assert torch.equal(logits[row][got[row]].sort().values,
                           logits[row][torch.isfinite(scores)].sort().values), row
    assert 1 <= int(got.sum(-1).min()) and int(got.sum(-1).max()) <= 50


def test_top_k_keeps_the_ties_of_the_kth_among_the_candidates():
    """Twelve codes tie with the 50th: the top-k rule keeps all 57 (``CANDIDATES`` has room
    for 14 ties), and the ids are the codes'."""
    from omni_ray.runners.transformers.code_predictor_graph import candidates

    logits = torch.cat([torch.linspace(10, 5, 45), torch.full((12,), 4.0),
                        torch.linspace(3, -3, 2048 - 57)])[torch.randperm(2048)][None]
    top, ids = candidates(logits, top_p=1.0)
    kept = ids[torch.isfinite(top)]
    assert sorted(kept.tolist()) == sorted(torch.nonzero(logits[0] >= 4.0).flatten().tolist())
    assert kept.numel() == 57 and torch.equal(logits[0, ids[0]], torch.sort(logits[0]).values[-64:])


@pytest.mark.parametrize("width", [64, 2048])  # CANDIDATES, the whole codebook
def test_exponential_race_draws_from_the_filtered_distribution(width):
    from omni_ray.runners.transformers.code_predictor_graph import _pick, top_k_top_p

    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5] + [-9.0] * 2044])[:, torch.randperm(2048)]
    want = top_k_top_p(logits).softmax(-1)[0]
    draws = torch.stack([_pick(logits, True, width) for _ in range(4000)]).flatten()
    freq = torch.bincount(draws, minlength=2048).float() / draws.numel()
    assert set(draws.tolist()) <= set(torch.nonzero(want).flatten().tolist())
    assert torch.allclose(freq, want, atol=0.03), (freq[want > 0], want[want > 0])


@pytest.mark.slow
@torch.inference_mode()
def test_compiled_decoder_picks_the_same_codes(talker_parts):
    """``StageConfig.compile_graphs``: the decoder the CUDA graphs capture, torch.compile'd as
    ``CodePredictorGraphs`` compiles it (dynamic shapes, whole graph: a graph break raises), picks
    the codes the eager decoder picks, for a single request and a batch (on CPU: inductor's C++
    kernels; the GPU check runs the Triton ones inside the graphs)."""
    from omni_ray.runners.transformers.code_predictor_graph import decoder_layers, head_step

    talker = _deeper(talker_parts.module)
    graphs = CodePredictorGraphs(talker, "cpu", torch.float32, compile=True, fuse=True)
    assert graphs.decoder is not decoder_layers and graphs.head is not head_step
    assert CodePredictorGraphs(talker, "cpu", torch.float32, compile=True,
                               compile_head=False).head is head_step
    cp = talker.code_predictor.model.config
    gen = torch.Generator().manual_seed(0)
    runs = []
    for batch in (1, 3):
        hidden = torch.randn(batch, 1, talker.config.text_config.hidden_size, generator=gen)
        code0 = torch.randint(0, 2048, (batch,), generator=gen)
        runs.append([])
        for decoder, layers in ((decoder_layers, None), (graphs.decoder, None),
                                (graphs.decoder, graphs.fused)):
            kv = [(torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim),
                   torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim))
                  for _ in range(cp.num_hidden_layers)]
            runs[-1].append(lambda kv=kv, d=decoder, ls=layers, h=hidden, c=code0: static_codes(
                talker, h, c, kv, decoder=d, layers=ls,
                head=head_step if d is decoder_layers else graphs.head))
    # one layer kind per compile, as in a stage (the two kinds together pass dynamo's limit)
    out = [[run() for run in kinds[:2]] for kinds in runs]
    torch._dynamo.reset()
    for got, kinds in zip(out, runs):
        got.append(kinds[2]())
    for eager, *others in out:  # compiled, then compiled with the fused GEMMs (the GPU default)
        for other in others:
            assert torch.equal(eager[0], other[0])
            torch.testing.assert_close(eager[1], other[1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@torch.inference_mode()
def test_compiled_head_draws_what_the_eager_head_draws(talker_parts):
    """Sampled frames: each step's compiled ``head_step`` (head, top-k/top-p filter, the
    exponential race, embedding) picks the codes the eager one picks from the same Exp(1)
    variates; one compile serves every step and both batch sizes past the first."""
    from omni_ray.runners.transformers.code_predictor_graph import head_step

    talker = _deeper(talker_parts.module)
    compiled = torch.compile(head_step, dynamic=True, fullgraph=True)
    cp = talker.code_predictor.model.config
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 3):
        hidden = torch.randn(batch, 1, talker.config.text_config.hidden_size, generator=gen)
        code0 = torch.randint(0, 2048, (batch,), generator=gen)
        got = []
        for head in (head_step, compiled):
            kv = [(torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim),
                   torch.zeros(batch, cp.num_key_value_heads, 16, cp.head_dim))
                  for _ in range(cp.num_hidden_layers)]
            torch.manual_seed(batch)  # the same variates for both
            got.append(static_codes(talker, hidden, code0, kv, sample=True, head=head))
        assert torch.equal(got[0][0], got[1][0])
        torch.testing.assert_close(got[0][1], got[1][1], atol=1e-5, rtol=1e-5)


def test_fused_layers_share_the_modules_and_concatenate_the_weights(talker_parts):
    """``FusedLayer`` adds two weights (q/k/v, gate/up) and shares the rest with transformers'
    layer; the graphs hold them unless ``fuse=False``."""
    from omni_ray.runners.transformers.code_predictor_graph import fused_layers

    talker = talker_parts.module
    layers = fused_layers(talker)
    for fl, layer in zip(layers, talker.code_predictor.model.layers):
        a, m = layer.self_attn, layer.mlp
        assert fl.self_attn is a and fl.mlp is m and fl.input_layernorm is layer.input_layernorm
        assert torch.equal(fl.qkv_weight, torch.cat([a.q_proj.weight, a.k_proj.weight,
                                                     a.v_proj.weight]))
        assert torch.equal(fl.gate_up_weight, torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        assert sum(fl.qkv_sizes) == fl.qkv_weight.shape[0]
    assert CodePredictorGraphs(talker, "cpu", torch.float32).fused is None
    assert len(CodePredictorGraphs(talker, "cpu", torch.float32, fuse=True).fused) == len(layers)


def test_fused_gemms_follow_the_dtype_unless_set():
    """``StageConfig.fused_code_predictor`` unset: as ``compile_graphs`` (bf16/fp16 on, float32
    off: bit-equal to transformers' eager code predictor)."""
    from omni_ray.config.serving import StageConfig

    assert StageConfig(dtype="bfloat16").fused_code_predictor is True
    assert StageConfig(dtype="float32").fused_code_predictor is False
    assert StageConfig(dtype="bfloat16", fused_code_predictor=False).fused_code_predictor is False
