"""GPU runs of the offline pipeline: backend parity (tiny checkpoint) and real-size throughput.

* ``--phase parity``: tiny checkpoint (made on the fly); the transformers-backend pipeline vs the same
  pipeline with ``thinker_backend="vllm"``, with ``talker_backend="vllm"`` and with both (all
  bfloat16), and transformers bfloat16 vs float32, over 3 prompts: same greedy text tokens? same
  codec frames? waveform max diff / peak.
* ``--phase realsize``: a Qwen3-Omni-30B-A3B-shaped config with random weights in bfloat16 on one
  GPU: the thinker on vLLM (``load_format="dummy"``, CUDA graphs), the talker's backbone on vLLM
  (``--talker vllm``, dummy weights, CUDA graphs) or transformers, its code predictor and code2wav
  built from the config with random init. Offline pipeline in async_chunk mode at concurrency 1/8/32, sync
  time to first audio at concurrency 1, and code2wav window vs stateful vocoder time.

``--device cpu --smoke`` runs both phases with tiny sizes and the transformers thinker (a check
that the script works, not a measurement).

    python -m benchmarks.gpu_run --phase all --out /tmp/gpu_out
    python -m benchmarks.gpu_run --phase all --device cpu --smoke --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.config.sampling import SamplingParams
from omni_ray.models.dummy import reinit_, shape_config_dict
from omni_ray.models.tiny import make_tiny_checkpoint, write_tokenizer
from omni_ray.models.tokenizer import load_tokenizer
from omni_ray.offline import Omni
from omni_ray.runners.transformers.code2wav import Code2WavRunner
from omni_ray.runners.transformers.talker import TalkerRunner
from omni_ray.runners.vllm.talker import VllmTalkerRunner

T_START = time.perf_counter()
SAMPLED_TALKER = False  # --talker-sampling: serve_configs/qwen3_omni.yaml's talker sampling
TALKER_SAMPLING = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)
# The checkpoints here carry no processor files (text prompts): the vLLM thinker skips them.
TEXT_ONLY = dict(limit_mm_per_prompt={"image": 0, "video": 0, "audio": 0},
                 skip_tokenizer_init=True)

PROMPTS = [
    "Hello! Please introduce yourself in one sentence.",
    "What is the capital of France, and why is it famous?",
    "Tell me a short story about a robot learning to sing.",
]
LONG_TEXT = ("Explain, step by step and in simple words, how a steam engine turns heat into motion, "
             "what the boiler, the piston and the flywheel each do, and why early railways used it. "
             "Then give two examples of modern machines that work on a similar principle and one "
             "reason why electric motors replaced steam in most factories during the last century.")


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T_START:7.1f}s] {msg}", flush=True)


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def device_info(device: str) -> dict:
    info = dict(device=device, torch=torch.__version__)
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except Exception:
        pass
    try:
        import vllm
        info["vllm"] = vllm.__version__
    except Exception:
        pass
    if str(device).startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_mem_gib=round(p.total_memory / 2**30, 1))
    return info


# ------------------------------------------------------------------------------------------------
# parity
# ------------------------------------------------------------------------------------------------
def run_parity(args, out: Path) -> dict:
    device = args.device
    res = dict(phase="parity", info=device_info(device), runs={}, comparisons={}, errors=[])
    path = out / "gpu_parity.json"
    ckpt = Path(tempfile.mkdtemp(prefix="omni_tiny_")) / "ckpt"
    t = time.perf_counter()
    make_tiny_checkpoint(ckpt, seed=0, processor=False)  # text prompts only here
    log(f"tiny checkpoint at {ckpt} ({time.perf_counter() - t:.1f}s)")
    max_tokens = 24 if args.smoke else 48
    max_frames = 40 if args.smoke else 80

    def run_one(name, **kw):
        t0 = time.perf_counter()
        omni = Omni(ckpt, "async_chunk", device=device, **kw)
        t_build = time.perf_counter() - t0
        reqs = [OmniRequest(request_id=f"p{i}", prompt_token_ids=omni.prompt_ids(p),
                            max_tokens=max_tokens, max_audio_frames=max_frames)
                for i, p in enumerate(PROMPTS)]
        t1 = time.perf_counter()
        outs = omni.generate(reqs)
        sync(device)
        t_gen = time.perf_counter() - t1
        res["runs"][name] = dict(build_s=round(t_build, 2), generate_s=round(t_gen, 3),
                                 outputs=[o.summary() for o in outs])
        log(f"{name}: build {t_build:.1f}s generate {t_gen:.2f}s "
            f"tokens {[len(o.text_token_ids) for o in outs]} frames "
            f"{[int(o.codec_frames.shape[0]) for o in outs]}")
        try:
            omni.shutdown()
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"{name} shutdown: {e!r}")
        del omni
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
        return [(o.text_token_ids, o.codec_frames.cpu(), o.audio.float().cpu()) for o in outs]

    def compare(a, b):
        rows = []
        for i, ((ta, fa, wa), (tb, fb, wb)) in enumerate(zip(a, b)):
            first_tok = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y),
                             None if len(ta) == len(tb) else min(len(ta), len(tb)))
            same_frames = fa.shape == fb.shape and bool(torch.equal(fa, fb))
            first_frame = None
            if not same_frames:
                n = min(fa.shape[0], fb.shape[0])
                diff = (fa[:n] != fb[:n]).any(dim=1).nonzero()
                first_frame = int(diff[0]) if diff.numel() else n
            n = min(wa.numel(), wb.numel())
            peak = float(max(wa.abs().max().item() if wa.numel() else 0.0,
                             wb.abs().max().item() if wb.numel() else 0.0))
            maxdiff = float((wa[:n] - wb[:n]).abs().max().item()) if n else None
            rows.append(dict(prompt=i, same_text_tokens=ta == tb, tokens=[len(ta), len(tb)],
                             first_token_mismatch=first_tok, same_codec_frames=same_frames,
                             frames=[int(fa.shape[0]), int(fb.shape[0])],
                             first_frame_mismatch=first_frame,
                             samples=[wa.numel(), wb.numel()], wave_max_diff=maxdiff,
                             wave_peak=peak,
                             wave_max_diff_over_peak=(maxdiff / peak if maxdiff is not None and peak
                                                      else None)))
        return dict(all_text_same=all(r["same_text_tokens"] for r in rows),
                    all_frames_same=all(r["same_codec_frames"] for r in rows), prompts=rows)

    results = {}
    specs = [("transformers_bf16", dict(dtype=torch.bfloat16, thinker_backend="transformers")),
             ("transformers_fp32", dict(dtype=torch.float32, thinker_backend="transformers"))]
    if not args.skip_vllm:
        ekw = dict(dtype="bfloat16" if device != "cpu" else "float32", enforce_eager=True,
                   gpu_memory_utilization=0.2, max_model_len=4096, **TEXT_ONLY)
        # the talker's vLLM engine with CUDA graphs (the path a GPU deployment takes)
        tkw = dict(ekw, enforce_eager=device == "cpu", gpu_memory_utilization=0.1,
                   kv_cache_memory_bytes=1 << 30)
        specs[1:1] = [
            ("vllm_talker_bf16", dict(dtype=torch.bfloat16, talker_backend="vllm",
                                      talker_engine_kwargs=tkw)),
            ("vllm_both_bf16", dict(dtype=torch.bfloat16, thinker_backend="vllm",
                                    thinker_engine_kwargs=ekw, talker_backend="vllm",
                                    talker_engine_kwargs=tkw)),
        ]
    for name, kw in specs:
        try:
            results[name] = run_one(name, **kw)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["errors"].append(f"{name}: {e!r}")
        write_json(path, res)
    for a, b in [("transformers_bf16", "transformers_fp32"),
                 ("transformers_bf16", "vllm_talker_bf16"), ("vllm_talker_bf16", "transformers_fp32"),
                 ("transformers_bf16", "vllm_both_bf16"), ("vllm_both_bf16", "transformers_fp32"),
                 ("vllm_talker_bf16", "vllm_both_bf16")]:
        if a in results and b in results:
            res["comparisons"][f"{a}_vs_{b}"] = compare(results[a], results[b])
            c = res["comparisons"][f"{a}_vs_{b}"]
            log(f"{a} vs {b}: text same {c['all_text_same']} frames same {c['all_frames_same']} "
                f"maxdiff/peak {[r['wave_max_diff_over_peak'] for r in c['prompts']]}")
    write_json(path, res)
    return res


# ------------------------------------------------------------------------------------------------
# realsize
# ------------------------------------------------------------------------------------------------
def realsize_config(smoke: bool) -> dict:
    """config.json of a Qwen3-Omni-30B-A3B-shaped checkpoint (the released sizes, encoders
    included), or its CPU-sized ``smoke`` shape: ``omni_ray.models.dummy``'s shapes."""
    return shape_config_dict("smoke" if smoke else "qwen3-omni-30b-a3b")


def build_dummy_stages(cfg, device: str, dtype):
    """Talker (+ a random thinker text embedding) and code2wav from config, random init."""
    from transformers import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeTalkerForConditionalGeneration

    torch.manual_seed(0)
    hidden = cfg.thinker_config.text_config.hidden_size
    vocab = cfg.thinker_config.text_config.vocab_size
    with torch.device(device):
        talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(
            cfg.talker_config, dtype=dtype).eval()
        n1 = reinit_(talker)
        emb = torch.nn.Embedding(vocab, hidden, dtype=dtype)
        torch.nn.init.normal_(emb.weight, 0.0, 0.02)
        c2w = Qwen3OmniMoeCode2Wav._from_config(cfg.code2wav_config, dtype=dtype).eval()
        n2 = reinit_(c2w)
    log(f"dummy talker {sum(p.numel() for p in talker.parameters()) / 1e9:.2f}B params "
        f"(re-init {n1}), code2wav {sum(p.numel() for p in c2w.parameters()) / 1e9:.3f}B "
        f"(re-init {n2})")
    return talker, emb, c2w


def assemble_omni(model_dir, cfg, thinker, talker, emb, c2w, device, mode="async_chunk",
                  max_num_seqs=64, code2wav_mode="window", talker_runner=None) -> Omni:
    """An ``Omni`` from ready modules (what ``Omni.__init__`` does after loading)."""
    omni = Omni.__new__(Omni)
    omni.model_dir = Path(model_dir)
    omni.pipeline = PipelineConfig(mode=mode, code2wav_mode=code2wav_mode)
    omni.thinker = thinker
    omni.config = cfg
    omni.tokenizer = load_tokenizer(model_dir)
    omni._injected_thinker = thinker
    if talker_runner is None:
        talker_runner = TalkerRunner(talker, emb, cfg, max_num_seqs=max_num_seqs, device=device)
        talker_runner.warm_up()
    omni.talker = talker_runner
    omni.code2wav = Code2WavRunner(c2w, mode=code2wav_mode,
                                   left_context_frames=omni.pipeline.left_context_frames,
                                   device=device)
    omni.groups = cfg.talker_config.num_code_groups
    return omni


class StageTimer:
    """Wraps the runners' step/decode methods to accumulate busy time per stage."""

    def __init__(self, omni: Omni, device: str):
        self.device = device
        self.t = dict(thinker=0.0, talker=0.0, code2wav=0.0)
        for stage, obj, meth in [("thinker", omni.thinker, "step"), ("talker", omni.talker, "step"),
                                 ("code2wav", omni.code2wav, "decode")]:
            setattr(obj, meth, self._wrap(stage, getattr(obj, meth)))

    def _wrap(self, stage, fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            r = fn(*a, **k)
            sync(self.device)
            self.t[stage] += time.perf_counter() - t0
            return r
        return inner

    def reset(self):
        for k in self.t:
            self.t[k] = 0.0


def make_prompts(omni: Omni, n: int) -> list[list[int]]:
    """n prompts of ~30-100 tokens (chat-formatted)."""
    words = LONG_TEXT.split()
    out = []
    for i in range(n):
        k = 12 + (i * 37) % (len(words) - 12)  # 12 .. len(words) words
        text = f"[{i}] " + " ".join(words[:k])
        out.append(omni.prompt_ids(text))
    return out


def run_batch(omni: Omni, timer: StageTimer, n: int, max_tokens: int, max_frames: int,
              device: str, tag: str) -> dict:
    prompts = make_prompts(omni, n)
    extra = {"talker_sampling": TALKER_SAMPLING} if SAMPLED_TALKER else {}
    reqs = [OmniRequest(request_id=f"{tag}-{i}", prompt_token_ids=p, max_tokens=max_tokens,
                        max_audio_frames=max_frames, **extra) for i, p in enumerate(prompts)]
    timer.reset()
    sync(device)
    t0 = time.perf_counter()
    outs = omni.generate(reqs)
    sync(device)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.text_token_ids) for o in outs)
    frames = sum(int(o.codec_frames.shape[0]) for o in outs)
    audio_s = [o.audio.numel() / o.sample_rate for o in outs]
    ttfa = [o.time_to_first_audio for o in outs]
    ttft = [o.time_to_first_token for o in outs]
    rtf = [o.latency / a for o, a in zip(outs, audio_s) if a > 0]
    r = dict(concurrency=n, mode=omni.pipeline.mode, wall_s=round(wall, 3),
             prompt_tokens=[min(map(len, prompts)), max(map(len, prompts))],
             text_tokens=tokens, codec_frames=frames, audio_seconds=round(sum(audio_s), 3),
             thinker_tokens_per_s=tokens / wall, talker_frames_per_s=frames / wall,
             audio_seconds_per_s=sum(audio_s) / wall,
             stage_busy_s={k: round(v, 3) for k, v in timer.t.items()},
             thinker_tokens_per_busy_s=tokens / timer.t["thinker"] if timer.t["thinker"] else None,
             talker_frames_per_busy_s=frames / timer.t["talker"] if timer.t["talker"] else None,
             ttft_p50=pct(ttft, 0.5), ttfa_p50=pct(ttfa, 0.5), ttfa_p90=pct(ttfa, 0.9),
             rtf_p50=pct(rtf, 0.5), rtf_p90=pct(rtf, 0.9),
             finish=sorted({o.finish_reason.name.lower() for o in outs}),
             frames_per_request=[min(int(o.codec_frames.shape[0]) for o in outs),
                                 max(int(o.codec_frames.shape[0]) for o in outs)],
             tokens_per_request=[min(len(o.text_token_ids) for o in outs),
                                 max(len(o.text_token_ids) for o in outs)])
    log(f"{tag}: C={n} wall {wall:.2f}s tok/s {r['thinker_tokens_per_s']:.1f} "
        f"frames/s {r['talker_frames_per_s']:.1f} ttfa p50 {r['ttfa_p50']} rtf p50 {r['rtf_p50']} "
        f"busy {r['stage_busy_s']}")
    r["_frames"] = [o.codec_frames for o in outs]
    return r


def vocoder_compare(c2w, frames: torch.Tensor, device: str, reps: int = 2) -> dict:
    """code2wav window (ctx 25) vs stateful on the same frames, chunked 4 then 25 as in serving."""
    res = {}
    frames = frames.to(device)
    spf = int(c2w.total_upsample)
    audio_s = frames.shape[0] * spf / 24000
    for mode in ("window", "stateful"):
        try:
            times = []
            for rep in range(reps + 1):  # first one is a warm-up
                runner = Code2WavRunner(c2w, mode=mode, left_context_frames=25, device=device)
                runner.add_request("v")
                sync(device)
                t0 = time.perf_counter()
                s, pieces = 0, []
                while s < frames.shape[0]:
                    e = min(frames.shape[0], s + (4 if s == 0 else 25))
                    _, piece = runner.decode("v", frames[s:e])
                    pieces.append(piece)
                    s = e
                runner.finish("v")
                sync(device)
                if rep:
                    times.append(time.perf_counter() - t0)
            res[mode] = dict(frames=int(frames.shape[0]), audio_s=audio_s,
                             vocoder_s=min(times), vocoder_s_per_audio_s=min(times) / audio_s,
                             samples=int(sum(p.numel() for p in pieces)))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res[mode] = dict(error=repr(e))
    log(f"vocoder: {res}")
    return res


def run_realsize(args, out: Path) -> dict:
    from transformers import Qwen3OmniMoeConfig

    device, dtype = args.device, (torch.bfloat16 if args.device != "cpu" else torch.float32)
    deadline = T_START + args.time_budget
    res = dict(phase="realsize", info=device_info(device), errors=[], async_chunk={},
               skipped=[])
    path = out / f"gpu_realsize{args.tag}.json"
    ckpt = Path(tempfile.mkdtemp(prefix="omni_real_")) / "ckpt"
    ckpt.mkdir(parents=True)
    cfg_dict = realsize_config(args.smoke)
    (ckpt / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    write_tokenizer(ckpt)
    cfg = Qwen3OmniMoeConfig.from_pretrained(str(ckpt), local_files_only=True)
    res["config"] = dict(thinker_text={k: cfg_dict["thinker_config"]["text_config"][k] for k in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size")},
        talker_text={k: cfg_dict["talker_config"]["text_config"][k] for k in (
            "num_hidden_layers", "hidden_size", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size")})
    max_seqs = 32 if not args.smoke else 8
    max_tokens = args.max_tokens if not args.smoke else 16
    max_frames = args.max_audio_frames if not args.smoke else 24
    res.update(max_tokens=max_tokens, max_audio_frames=max_frames)

    # talker + code2wav first, so vLLM sizes its memory against what is left.
    t0 = time.perf_counter()
    talker, emb, c2w = build_dummy_stages(cfg, device, dtype)
    sync(device)
    res["talker_code2wav_build_s"] = round(time.perf_counter() - t0, 2)
    if device != "cpu":
        free, total = torch.cuda.mem_get_info()
        res["mem_after_talker_gib"] = dict(free=round(free / 2**30, 1), total=round(total / 2**30, 1))
    write_json(path, res)

    t0 = time.perf_counter()
    if args.smoke or args.thinker == "transformers":
        from transformers import Qwen3OmniMoeThinkerForConditionalGeneration
        from omni_ray.runners.transformers.thinker import ThinkerRunner
        with torch.device(device):
            th = Qwen3OmniMoeThinkerForConditionalGeneration._from_config(
                cfg.thinker_config, dtype=dtype).eval()
        reinit_(th)
        thinker = ThinkerRunner(th, eos_token_ids=[cfg.im_end_token_id], max_num_seqs=max_seqs,
                                device=device)
        res["thinker_backend"] = "transformers"
    else:
        from omni_ray.runners.vllm.thinker import VllmThinkerRunner
        free, total = torch.cuda.mem_get_info()
        util = min(0.55 if total > 120 * 2**30 else 0.9, (free - 4 * 2**30) / total)
        ekw = dict(dtype="bfloat16", load_format="dummy", gpu_memory_utilization=round(util, 3),
                   max_model_len=4096, enforce_eager=False, **TEXT_ONLY)
        res["engine_kwargs"] = ekw
        log(f"starting vLLM engine {ekw}")
        thinker = VllmThinkerRunner(ckpt, dtype="bfloat16", max_num_seqs=max_seqs,
                                    engine_kwargs=ekw)
        res["thinker_backend"] = "vllm"
    res["engine_start_s"] = round(time.perf_counter() - t0, 1)
    log(f"thinker ready in {res['engine_start_s']}s")
    if device != "cpu":
        free, total = torch.cuda.mem_get_info()
        res["mem_after_engine_gib"] = dict(free=round(free / 2**30, 1))
    write_json(path, res)

    talker_runner = None
    res["talker_backend"] = args.talker
    if args.talker == "vllm":
        t0 = time.perf_counter()
        tkw = dict(dtype="bfloat16" if device != "cpu" else "float32", load_format="dummy",
                   gpu_memory_utilization=0.1, kv_cache_memory_bytes=4 << 30,
                   max_model_len=4096, enforce_eager=device == "cpu")
        res["talker_engine_kwargs"] = tkw
        log(f"starting the vLLM talker engine {tkw}")
        talker_runner = VllmTalkerRunner(ckpt, talker, emb, cfg, device=device,
                                         max_num_seqs=max_seqs, engine_kwargs=tkw)
        talker_runner.warm_up()
        res["talker_engine_start_s"] = round(time.perf_counter() - t0, 1)
        log(f"talker engine ready in {res['talker_engine_start_s']}s")
        write_json(path, res)
    omni = assemble_omni(ckpt, cfg, thinker, talker, emb, c2w, device, max_num_seqs=max_seqs,
                         talker_runner=talker_runner)
    if not args.cp_graphs:
        omni.talker.inputs.cp_graphs = None
    res["code_predictor_cuda_graphs"] = omni.talker.inputs.cp_graphs is not None
    res["talker_sampling"] = TALKER_SAMPLING.model_dump() if SAMPLED_TALKER else "greedy"
    timer = StageTimer(omni, device)

    def time_left():
        return deadline - time.perf_counter()

    # warm-up (kernels, allocator)
    t0 = time.perf_counter()
    try:
        run_batch(omni, timer, 2, min(16, max_tokens), min(16, max_frames), device, "warm")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res["errors"].append(f"warmup: {e!r}")
        write_json(path, res)
        return res
    res["warmup_s"] = round(time.perf_counter() - t0, 1)

    keep_frames = None
    last = {}
    for n in args.concurrency:
        if n > 1 and "c1" in last:
            # crude estimate: C=n costs at most ~ (1 + n/8) x the C=1 wall time
            est = last["c1"] * (1 + n / 8) * 1.3
            if est > time_left() - 20:
                res["skipped"].append(f"concurrency {n} (est {est:.0f}s, left {time_left():.0f}s)")
                log(f"skip C={n}")
                continue
        try:
            r = run_batch(omni, timer, n, max_tokens, max_frames, device, f"c{n}")
            fr = r.pop("_frames")
            if keep_frames is None:
                keep_frames = max(fr, key=lambda f: f.shape[0])
            res["async_chunk"][str(n)] = r
            last[f"c{n}"] = r["wall_s"]
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["errors"].append(f"async C={n}: {e!r}")
        write_json(path, res)
        if n == 1:
            # sync mode, C=1, same modules
            if time_left() > 60:
                try:
                    omni.pipeline = omni.pipeline.model_copy(update={"mode": "sync"})
                    r = run_batch(omni, timer, 1, max_tokens, max_frames, device, "sync1")
                    r.pop("_frames")
                    res["sync_c1"] = r
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    res["errors"].append(f"sync C=1: {e!r}")
                finally:
                    omni.pipeline = omni.pipeline.model_copy(update={"mode": "async_chunk"})
            write_json(path, res)
            if keep_frames is not None and time_left() > 45:
                res["vocoder"] = vocoder_compare(c2w, keep_frames, device)
            write_json(path, res)
    res["total_s"] = round(time.perf_counter() - T_START, 1)
    write_json(path, res)
    (out / f"gpu_realsize{args.tag}.md").write_text(realsize_markdown(res))
    for runner in (talker_runner, thinker):
        try:
            if runner is not None and hasattr(runner, "shutdown"):
                runner.shutdown()
        except Exception:  # noqa: BLE001
            pass
    return res


class FakeThinker:
    """Emits one random text token per request per step, instantly (talker profiling)."""

    def __init__(self):
        self._reqs = {}
        self._gen = torch.Generator().manual_seed(0)

    def add_request(self, rid, prompt, params, max_tokens, stop):
        self._reqs[rid] = [len(prompt), max_tokens, 0]

    def has_unfinished(self):
        return bool(self._reqs)

    def abort(self, rid):
        return self._reqs.pop(rid, None) is not None

    def step(self):
        from omni_ray.payload import FinishReason
        from omni_ray.runners.transformers.thinker import ThinkerStepOutput
        outs = []
        for rid, st in list(self._reqs.items()):
            st[2] += 1
            tok = int(torch.randint(1000, 100000, (1,), generator=self._gen))
            done = st[2] >= st[1]
            outs.append(ThinkerStepOutput(rid, [tok], done,
                                          FinishReason.LENGTH if done else FinishReason.NONE,
                                          st[0]))
            if done:
                del self._reqs[rid]
        return outs


def run_talkerprof(args, out: Path) -> dict:
    """Talker time split (backbone per request vs batched code predictor) at C=1/8/32."""
    from transformers import Qwen3OmniMoeConfig

    device, dtype = args.device, (torch.bfloat16 if args.device != "cpu" else torch.float32)
    res = dict(phase="talkerprof", info=device_info(device), runs={}, errors=[])
    path = out / "gpu_talkerprof.json"
    ckpt = Path(tempfile.mkdtemp(prefix="omni_prof_")) / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(realsize_config(args.smoke), indent=2))
    write_tokenizer(ckpt)
    cfg = Qwen3OmniMoeConfig.from_pretrained(str(ckpt), local_files_only=True)
    talker, emb, c2w = build_dummy_stages(cfg, device, dtype)
    res["experts_implementation"] = str(getattr(talker.config.text_config,
                                                "_experts_implementation", None))
    res["attn_implementation"] = str(getattr(talker.config.text_config,
                                             "_attn_implementation", None))
    omni = assemble_omni(ckpt, cfg, FakeThinker(), talker, emb, c2w, device, max_num_seqs=64)
    timer = StageTimer(omni, device)
    parts = dict(forward=0.0, cp_batch=0.0, cp_single=0.0, n_forward=0, n_cp_batch=0)
    tk = omni.talker

    def wrap(name, fn):
        def inner(*a, **k):
            sync(device)
            t0 = time.perf_counter()
            r = fn(*a, **k)
            sync(device)
            parts[name] += time.perf_counter() - t0
            if "n_" + name in parts:
                parts["n_" + name] += 1
            return r
        return inner
    tk._forward = wrap("forward", tk._forward)
    tk._residual_codes_batch = wrap("cp_batch", tk._residual_codes_batch)
    tk._residual_codes = wrap("cp_single", tk._residual_codes)
    frames = 24 if args.smoke else 60
    run_batch(omni, timer, 2, 8, 8, device, "warm")
    for n in args.concurrency:
        for k in parts:
            parts[k] = 0 if k.startswith("n_") else 0.0
        try:
            r = run_batch(omni, timer, n, frames + 8, frames, device, f"prof{n}")
            r.pop("_frames")
            r["talker_parts_s"] = dict(parts)
            r["ms_per_talker_step"] = 1000 * timer.t["talker"] / frames
            r["ms_backbone_per_request_forward"] = (1000 * parts["forward"] / parts["n_forward"]
                                                    if parts["n_forward"] else None)
            r["ms_code_predictor_per_batch"] = (1000 * parts["cp_batch"] / parts["n_cp_batch"]
                                                if parts["n_cp_batch"] else None)
            res["runs"][str(n)] = r
            log(f"prof C={n}: {r['ms_per_talker_step']:.1f} ms/step parts {parts}")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["errors"].append(f"C={n}: {e!r}")
        write_json(path, res)
    return res


def realsize_markdown(res: dict) -> str:
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    info = res.get("info", {})
    lines = [f"# Real-size (30B-A3B-shaped, random weights) offline pipeline on "
             f"{info.get('gpu', info.get('device'))}", "",
             f"thinker backend {res.get('thinker_backend')}, engine start {res.get('engine_start_s')} s, "
             f"talker backend {res.get('talker_backend', 'transformers')}"
             f"{', engine start ' + str(res['talker_engine_start_s']) + ' s' if 'talker_engine_start_s' in res else ''}, "
             f"code predictor CUDA graphs {res.get('code_predictor_cuda_graphs')}, "
             f"talker sampling {res.get('talker_sampling', 'greedy')}, "
             f"max_tokens {res.get('max_tokens')}, max_audio_frames {res.get('max_audio_frames')}", "",
             "| mode | C | wall s | thinker tok/s | talker frames/s | TTFA p50 s | TTFA p90 s | "
             "RTF p50 | audio s / s |", "|---|---|---|---|---|---|---|---|---|"]
    rows = [("async_chunk", r) for _, r in sorted(res.get("async_chunk", {}).items(),
                                                  key=lambda kv: int(kv[0]))]
    if "sync_c1" in res:
        rows.append(("sync", res["sync_c1"]))
    for mode, r in rows:
        lines.append(f"| {mode} | {r['concurrency']} | {f(r['wall_s'])} | "
                     f"{f(r['thinker_tokens_per_s'], 1)} | {f(r['talker_frames_per_s'], 1)} | "
                     f"{f(r['ttfa_p50'], 3)} | {f(r['ttfa_p90'], 3)} | {f(r['rtf_p50'], 3)} | "
                     f"{f(r['audio_seconds_per_s'], 2)} |")
    voc = res.get("vocoder")
    if voc:
        lines += ["", "| code2wav mode | frames | vocoder s per audio s |", "|---|---|---|"]
        for m, v in voc.items():
            lines.append(f"| {m} | {v.get('frames', '-')} | "
                         f"{f(v.get('vocoder_s_per_audio_s'), 4)} |")
    if res.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(res["skipped"])]
    if res.get("errors"):
        lines += ["", "Errors: " + "; ".join(res["errors"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=["parity", "realsize", "all", "talkerprof"], default="all")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check)")
    ap.add_argument("--skip-vllm", action="store_true", help="parity: transformers only")
    ap.add_argument("--thinker", choices=["vllm", "transformers"], default="vllm",
                    help="realsize thinker backend")
    ap.add_argument("--talker", choices=["vllm", "transformers"], default="vllm",
                    help="realsize talker backbone backend")
    ap.add_argument("--no-cp-graphs", dest="cp_graphs", action="store_false",
                    help="realsize: the code predictor in eager PyTorch (A/B of its CUDA graphs)")
    ap.add_argument("--talker-sampling", action="store_true",
                    help="realsize: sampled talker (qwen3_omni.yaml's), not greedy")
    ap.add_argument("--tag", default="", help="suffix of the realsize result file names")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-audio-frames", type=int, default=150)
    ap.add_argument("--time-budget", type=float, default=540,
                    help="realsize: seconds (from script start) before skipping further runs")
    args = ap.parse_args(argv)
    global SAMPLED_TALKER
    SAMPLED_TALKER = args.talker_sampling
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke and args.device == "cpu":
        args.skip_vllm = True
    rc = 0
    if args.phase in ("parity", "all"):
        try:
            run_parity(args, args.out)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rc = 1
    if args.phase in ("realsize", "all"):
        try:
            run_realsize(args, args.out)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rc = 1
    if args.phase == "talkerprof":
        try:
            run_talkerprof(args, args.out)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
