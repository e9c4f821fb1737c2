"""The check to run on one GPU before landing a change to runners, models or stages (issue 17).

The app from ``serve_configs/qwen3_omni_1gpu.yaml`` started with the real ``serve run``:

* ``tiny``: the tiny checkpoint, greedy; ``--restarts`` starts in a row, each timed to healthy and
  one answer; text only, text + audio (streamed pcm16, wav), speech in -> text + audio, each
  compared with the offline transformers pipeline (``answers.compare_answers``; README "GPU
  check", "Parity allowance");
* ``standin``: ``make_dummy_checkpoint`` at real size (``smoke`` on CPU), the yaml's own settings;
  ``/v1/models`` says dummy, well-formed answers, then the Serve benchmark -> ``gpu_serve.json``;
* ``code2wav`` / ``codepred`` (when asked for): the code2wav step batched vs one by one, and the
  code predictor's graphs with eager vs compiled kernels (cuda only), at the released shapes;
* ``batch`` (when asked for): ``omni-ray batch`` (Ray Data) on the stand-in with the same engines;
* ``offline`` (only when asked for): ``benchmarks.gpu_run --phase realsize``, its JSON copied in;
* ``decode`` (when asked for, after ``standin``): plain vLLM on the thinker's backbone alone, per
  batch, beside the app's thinker step (``benchmarks/thinker_decode_bench.py``).

One line a check, ``PASS|FAIL|SKIP|INFO <name>: <numbers>`` (INFO: an A/B comparison), then a
summary; exit 1 on any FAIL.
``--device cpu`` runs the same with CPU values (float32, no GPUs), which the tests do::

    bash scripts/gpu_check.sh                          # cuda: tiny,standin
    bash scripts/gpu_check.sh --device cpu --phases tiny --out /tmp/check
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import operator
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from benchmarks.answers import (ask, audio_frames, cases, compare_answers, offline_answers,
                               well_formed)
from benchmarks.launch import free_port
from benchmarks.machine import machine_info
from benchmarks.metrics import slower_than_realtime
from benchmarks.overrides import parse_variant, set_dotted
from benchmarks.serve_proc import REPO_ROOT, ServeExited, ServeRun, child_env, tail

BASE_CONFIG = REPO_ROOT / "serve_configs" / "qwen3_omni_1gpu.yaml"
# omni_ray/pipeline/build.py's STAGES (pipeline order), not imported: that loads torch, and the
# preflight must report a missing package before anything heavy is imported
STAGES = ("thinker", "talker", "code2wav")
TINY = dict(max_model_len=2048, max_prompt_tokens=1024, max_tokens=24, frames=50,
            kv={"cuda": (1 << 30, 512 << 20), "cpu": (128 << 20, 128 << 20)})
# profile_steps: per stage engine in ``--torch-profile`` (a profiled CPU step costs seconds)
BENCH = {"cuda": dict(concurrency=[1, 8, 32], max_tokens=128, frames=150, profile_steps=40),
         "cpu": dict(concurrency=[1, 2], max_tokens=8, frames=12, profile_steps=3)}


# -- the config ----------------------------------------------------------------------------------
def app_config(model_dir: str, device: str, port: int, *, tiny: bool, dummy: bool,
               processor: bool, base: Path = BASE_CONFIG, dtype: str | None = None) -> dict:
    """``base`` (a ``serve run`` config) with ``model`` = ``model_dir`` on 127.0.0.1:``port``.

    ``tiny``: small KV and context, greedy sampling (the offline pipeline's defaults).
    ``dtype``: every stage's dtype instead of the file's (the tiny parity run: float32).
    ``device == "cpu"``: float32, no GPUs or CPU reservations, vLLM's CPU defaults
    (``CPU_ENGINE_DEFAULTS`` in runners/vllm/engine_args.py: eager, a fixed KV cache) and no GPU memory shares.
    """

    cfg = copy.deepcopy(yaml.safe_load(base.read_text()))
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    args = cfg["applications"][0]["args"]
    args.update(model=str(model_dir), make_tiny_if_missing=False)
    if dummy:
        args["allow_dummy_weights"] = True
    # /debug/timeline: where the time to first audio goes (benchmarks/timeline.py)
    args.setdefault("security", {})["enable_debug_endpoints"] = True
    if tiny:
        args["max_model_len"] = TINY["max_model_len"]
        args["limits"]["max_prompt_tokens"] = TINY["max_prompt_tokens"]
    for i, stage in enumerate(("thinker", "talker")):
        ek = args[stage].setdefault("engine_kwargs", {})
        if device != "cpu":  # every kernel JIT in traffic logged, not the first only (jit_lines)
            ek.setdefault("jit_monitor_verbose", True)
        if tiny:
            args[stage].pop("default_sampling", None)  # greedy, as OmniRequest's defaults
            ek["kv_cache_memory_bytes"] = TINY["kv"][device][i]
            ek["max_model_len"] = TINY["max_model_len"]
        if device == "cpu":
            ek.pop("gpu_memory_utilization", None)
            ek["kv_cache_memory_bytes"] = TINY["kv"]["cpu"][i]
            ek["max_model_len"] = min(ek.get("max_model_len", 2048), 2048)
            ek["max_num_batched_tokens"] = 512
    if not processor:  # no processor files: vLLM's thinker must not look for them (gpu_run's)
        args["thinker"]["engine_kwargs"].update(
            limit_mm_per_prompt={"image": 0, "video": 0, "audio": 0}, skip_tokenizer_init=True)
    if dtype:
        for stage in STAGES:
            args[stage]["dtype"] = dtype
    if device == "cpu":
        args["max_model_len"] = min(args["max_model_len"], 2048)
        args["limits"]["max_prompt_tokens"] = min(args["limits"]["max_prompt_tokens"], 1024)
        for stage in STAGES:
            args[stage].update(device="cpu", dtype="float32")
            mps = {k: v for k, v in args[stage].get("engine_resources", {}).items()
                   if k.startswith("mps_")}  # kept: their path to the engine is checked on CPU
            args[stage]["engine_resources"] = {"num_cpus": 0, "num_gpus": 0, **mps}
    return cfg


def write_config(cfg: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# -- the run -------------------------------------------------------------------------------------
class Check:
    """Collects the lines and the JSON of one run."""

    def __init__(self, args):
        self.args, self.t0 = args, time.perf_counter()
        self.lines: list[str] = []
        self.checks: list[dict] = []
        self.data: dict = dict(args={k: str(v) for k, v in vars(args).items()}, phases={})
        self.serve_levels: list[dict] = []  # the standin's Serve bench, for the batch phase
        self.base_again: list[dict] | None = None  # its second measurement (--repeat-base)
        self.base_mps = False  # the standin base under MPS (--standin-set mps=true)
        self.engine_stages: set[str] = set()  # stages an engine A/B changed (their MPS shares)

    def line(self, status: str, name: str, numbers: str = "", **detail) -> bool:
        text = f"{status} {name}: {numbers}"
        print(text, flush=True)
        self.lines.append(text)
        self.checks.append(dict(status=status, name=name, numbers=numbers, **detail))
        self.save()
        return status == "PASS"

    def save(self, summary: str | None = None) -> None:
        """gpu_check.json and .txt as they stand: a run killed at a time limit leaves them."""
        out = self.args.out
        self.data.update(checks=self.checks, summary=summary,
                         wall_s=round(time.perf_counter() - self.t0, 1))
        write(out / "gpu_check.json", self.data)
        (out / "gpu_check.txt").write_text("\n".join(self.lines + [summary or ""]).strip() + "\n")

    def left_s(self) -> float:
        return self.args.time_budget - (time.perf_counter() - self.t0)


def make_checkpoint(kind: str, out: Path, shape: str | None = None, processor: bool = True
                    ) -> tuple[str, bool]:
    """A fresh checkpoint (``tiny`` or ``dummy``) with processor files if asked for and they can
    be made (transformers' video processor needs torchvision); returns (dir, has_processor)."""
    if kind == "tiny":
        from omni_ray.models.tiny import make_tiny_checkpoint as make
        kw = dict(seed=0)
    else:
        from omni_ray.models.dummy import make_dummy_checkpoint as make
        kw = dict(shape=shape, seed=0)
    if processor:
        try:
            return str(make(out, processor=True, **kw)), True
        except ImportError as e:
            print(f"note: no processor files ({e}); speech-in is skipped", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    return str(make(out, processor=False, **kw)), False


def timed_start(chk: Check, cfg: dict, tag: str, url: str, ray_stop: bool,
                env: dict | None = None) -> tuple[ServeRun | None, dict]:
    """``serve run`` on ``cfg`` (``env`` added to its environment), timed to ``/health`` OK and
    to one answered chat request with audio (thinker, talker and code2wav all serving; engines
    load one after another); the running ServeRun (the caller stops it), or None and the error
    with the log's tail. Where ``serve run`` itself ended (its local Ray cluster did not come up
    or went down: ``ServeExited``), an INFO line says why and the start is made once more on a
    fresh cluster (``<tag>_retry.log``); an app that fails to deploy or start fails at once."""
    sr, st = _timed_start(chk, cfg, tag, url, ray_stop, env)
    if st.pop("serve_exited", False) and chk.left_s() > 120:
        chk.line("INFO", f"{tag} start retried", f"{st['error']}; once more on a fresh Ray "
                 f"cluster", log_tail=st["log_tail"])
        sr, st = _timed_start(chk, cfg, tag, url, ray_stop, env, log_tag=f"{tag}_retry")
        st.pop("serve_exited", None)
        st["retried"] = True
    return sr, st


def _timed_start(chk: Check, cfg: dict, tag: str, url: str, ray_stop: bool, env: dict | None,
                 log_tag: str | None = None) -> tuple[ServeRun | None, dict]:
    out = chk.args.out
    cpu_env = {"OMP_NUM_THREADS": "1", "RAY_memory_monitor_refresh_ms": "0"}
    sr = ServeRun(write_config(cfg, out / "configs" / f"{tag}.yaml"),
                  out / "logs" / f"{log_tag or tag}.log", ray_stop=ray_stop,
                  env={**(cpu_env if chk.args.device == "cpu" else {}), **(env or {})})
    sr.__enter__()
    try:
        healthy = sr.wait_healthy(url, start_timeout(chk))
        ans = ask(url, max_tokens=2, frames=2)  # text + audio: every stage has its engine
        ready = sr.since_launch()
        if not (ans["text"] or ans["finish"] == "length"):
            raise RuntimeError(f"first request: {ans}")
        # a stage's further replicas may still be starting: the bench waits for them all
        every = sr.wait_engines(extra_replicas(cfg), start_timeout(chk))
        st = dict(healthy_s=round(healthy, 1), first_answer_s=round(ready, 1),
                  all_engines_s=round(every, 1), start_phases=start_phases(sr))
        chk.line("INFO", f"{tag} start phases", "; ".join(
            f"{stage} " + ", ".join(f"{k.removesuffix('_s')} {v:g}s" for k, v in ph.items())
            for stage, ph in st["start_phases"].items()))
        return sr, st
    except Exception as e:  # noqa: BLE001 - reported as a FAIL line with the log's tail
        sr.stop()
        return None, dict(error=f"{type(e).__name__}: {e}", log_tail=tail(sr.log),
                          serve_exited=isinstance(e, ServeExited))
    except BaseException:  # Ctrl-C: no Ray left behind
        sr.stop()
        raise


def start_phases(sr: ServeRun) -> dict:
    """Each stage engine's start, by part, from the log (the wait for the GPU's start turn, the
    build, and the runner's own parts: vLLM's engine, kernel warm-up, graphs); a stage's second
    replica is ``<stage>#2``."""
    starts = sorted(sr.engine_starts(),  # pipeline order, then any other stage
                    key=lambda e: STAGES.index(e[0]) if e[0] in STAGES else len(STAGES))
    out: dict[str, dict] = {}
    for stage, phases in starts:
        n = sum(k.split("#")[0] == stage for k in out)
        out[stage if n == 0 else f"{stage}#{n + 1}"] = phases
    return out


def every_engine(st: dict) -> str:
    """", every engine <s>s" where a further replica started after the first answer."""
    late = st["all_engines_s"] > st["first_answer_s"] + 1
    return f", every engine {st['all_engines_s']}s" if late else ""


def extra_replicas(cfg: dict) -> dict[str, int]:
    """The stages the app runs with more than one replica (``<stage>.deployment_config.
    num_replicas``), and how many."""
    args = cfg["applications"][0]["args"]
    want = {stage: (args.get(stage) or {}).get("deployment_config", {}).get("num_replicas", 1)
            for stage in STAGES}
    return {stage: n for stage, n in want.items() if isinstance(n, int) and n > 1}


def start_timeout(chk: Check) -> float:
    """``--serve-timeout``, cut to the time budget left (less a margin to stop Ray)."""
    return max(1.0, min(chk.args.serve_timeout, chk.left_s() - 20))


def phase_tiny(chk: Check) -> None:
    a, dev = chk.args, chk.args.device
    model, has_proc = make_checkpoint("tiny", chk.tmp / "tiny", processor=not a.no_processor)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dtype = "float32" if dev == "cpu" else a.tiny_dtype
    cfg = app_config(model, dev, port, tiny=True, dummy=False, processor=has_proc, dtype=dtype)
    todo = cases(has_proc)
    pipeline = cfg["applications"][0]["args"]["pipeline"]
    t = time.perf_counter()
    refs = offline_answers(model, dev, pipeline, todo, TINY["max_tokens"], TINY["frames"],
                           dtype=dtype)
    res = dict(model=model, processor=has_proc, offline_s=round(time.perf_counter() - t, 1),
               starts=[], answers={})
    chk.data["phases"]["tiny"] = res
    from omni_ray.models.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    tokenize = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    for i in range(a.restarts):
        # A restart finds the compile caches warm (a fraction of the first start): it is tried
        # while a minute is left; one cut off by the budget is a SKIP, not a FAIL.
        if i and chk.left_s() < 60:
            chk.line("SKIP", f"tiny start {i + 1}/{a.restarts}", f"{chk.left_s():.0f}s left")
            continue
        sr, st = timed_start(chk, cfg, f"tiny_start{i + 1}", url, a.ray_stop)
        res["starts"].append(st)
        if sr is None:
            cut = i and chk.left_s() < 30 and "TimeoutError" in st["error"]
            chk.line("SKIP" if cut else "FAIL", f"tiny start {i + 1}/{a.restarts}",
                     ("time budget spent: " if cut else "") + st["error"],
                     log_tail=st["log_tail"])
            print(st["log_tail"], flush=True)
            continue
        with sr:
            chk.line("PASS", f"tiny start {i + 1}/{a.restarts}",
                     f"healthy {st['healthy_s']}s, first answer {st['first_answer_s']}s")
            if res["answers"]:
                continue
            for name, kw in todo.items():
                try:
                    got = ask(url, max_tokens=TINY["max_tokens"], frames=TINY["frames"], **kw)
                    c = compare_answers(refs[name], got, tokenize, exact=dtype == "float32")
                except Exception as e:  # noqa: BLE001
                    c = dict(ok=False, error=f"{type(e).__name__}: {e}")
                res["answers"][name] = c
                chk.line("PASS" if c["ok"] else "FAIL", f"tiny {name} == offline {dev}",
                         _cmp_numbers(c), **c)
    if not has_proc:
        chk.line("SKIP", "tiny speech-in == offline", "no processor files (torchvision?)")


def _cmp_numbers(c: dict) -> str:
    if "error" in c:
        return c["error"]
    return (f"text tokens {c['text_tokens']}, first text diff {c['first_text_diff']}, "
            f"samples {c.get('samples')}/{c.get('ref_samples')}, first frame diff "
            f"{c.get('first_frame_diff')}, pcm max diff {c.get('pcm_max_diff')}"
            + (f", offline's top-two margin there {c['ref_margin_at_diff'][0]:g} (bf16 bound "
               f"{c['ref_margin_at_diff'][1]:g})" if c.get("ref_margin_at_diff") else ""))


def phase_standin(chk: Check) -> None:
    a, dev = chk.args, chk.args.device
    shape = a.shape or ("smoke" if dev == "cpu" else "qwen3-omni-30b-a3b")
    t = time.perf_counter()
    model, has_proc = make_checkpoint("dummy", chk.tmp / "standin", shape, not a.no_processor)
    res = dict(model=model, shape=shape, processor=has_proc,
               make_s=round(time.perf_counter() - t, 1), answers={})
    chk.data["phases"]["standin"] = res
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = app_config(model, dev, port, tiny=False, dummy=True, processor=has_proc)
    base_set = parse_variant(f"set:{a.standin_set}")[1] if a.standin_set else {}
    # mps=true: the base under an MPS daemon too; a variant inherits it unless it says mps=false
    chk.base_mps = bool(base_set.pop("mps", False))
    res["mps"] = chk.base_mps
    if base_set:  # the base itself with other app args (e.g. the B of an A/B run apart)
        cfg = with_overrides(cfg, base_set)
    if a.realtime:  # realtime answers have no per-request frame bound: the app's default
        cfg = with_overrides(cfg, {"limits.default_max_audio_frames": REALTIME_FRAMES})
    with contextlib.ExitStack() as mps_stack:  # the base's daemon quits before the variants
        env = mps_env(chk, mps_stack, "base") if chk.base_mps else None
        if chk.base_mps and env is None:
            return
        base = standin_base(chk, a, dev, cfg, shape, url, has_proc, res, env)
    for name, overrides in a.ab:  # also when the base did not start (no A/B lines then)
        # the live ones and the MPS shares ran on the base's app
        if live_fields(overrides) is None and engine_fields(overrides) is None:
            standin_variant(chk, cfg, name, overrides, base)


def mps_env(chk: Check, stack: contextlib.ExitStack, tag: str) -> dict | None:
    """An MPS daemon for the rest of ``stack`` (omni_ray/mps.py): the environment its clients
    need, or None (a FAIL line) where there is no MPS."""
    from omni_ray.mps import mps_daemon

    try:
        return stack.enter_context(mps_daemon(chk.tmp / f"mps_{tag}"))
    except Exception as e:  # noqa: BLE001 - no MPS here: that start fails, the run goes on
        chk.line("FAIL", f"standin {tag} MPS daemon", f"{type(e).__name__}: {e}")
        return None


def standin_base(chk: Check, a, dev: str, cfg: dict, shape: str, url: str, has_proc: bool,
                 res: dict, env: dict | None) -> list[dict]:
    """The stand-in app started (``env``: an MPS daemon's, or None), checked and benched: its
    bench levels (none: it did not start)."""
    sr, st = timed_start(chk, cfg, "standin", url, a.ray_stop, env=env)
    res["start"] = st
    if sr is None:
        chk.line("FAIL", "standin start", st["error"], log_tail=st["log_tail"])
        print(st["log_tail"], flush=True)
        return []
    with sr:
        chk.line("PASS", "standin start", f"healthy {st['healthy_s']}s, "
                 f"first answer {st['first_answer_s']}s{every_engine(st)} "
                 f"(checkpoint made in {res['make_s']}s)")
        import httpx

        entry = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
        dummy = (entry.get("omni_ray") or {}).get("dummy_weights") is True
        chk.line("PASS" if dummy else "FAIL", "standin /v1/models says dummy",
                 json.dumps(entry.get("omni_ray")))
        stats = engines_mps(chk, url, cfg, "standin")
        if dev == "cuda":  # the vocoder's first calls replay CUDA graphs checked at its start
            rt = stats["code2wav"]["runner_time"]
            n = rt.get("graph_buckets", 0)
            chk.line("PASS" if n else "FAIL", "standin code2wav first-call graphs",
                     f"{n} batch buckets captured, each replay == the eager forward at start; "
                     f"{rt.get('graph_first_calls', 0)} first calls replayed so far")
            from omni_ray.config.serving import OmniServingArgs

            args = OmniServingArgs.model_validate(cfg["applications"][0]["args"])
            sizes = args.pipeline.code2wav_shapes(args.code2wav.dtype)
            want = len(sizes[0]) * len(sizes[1]) if sizes else 0
            got = rt.get("shapes_warmed", 0)
            chk.line("PASS" if got == want else "FAIL", "standin code2wav shapes warmed",
                     f"{got} (batch, frames) pairs run at start, eager forwards padded to them "
                     f"({sizes or 'off'})" + ("" if got == want else f"; the config asks {want}"))
            want = want if args.pipeline.code2wav_step_graphs else 0
            got = rt.get("step_graphs", 0)
            chk.line("PASS" if got == want else "FAIL", "standin code2wav step graphs",
                     f"{got} padded (batch, frames) pairs captured as CUDA graphs, each replay == "
                     f"the eager forward at start; {rt.get('graph_steps', 0)} steps replayed so "
                     f"far" + ("" if got == want else f"; the config asks {want}"))
        bench = BENCH[dev]
        for name, kw in cases(has_proc).items():
            try:
                got = ask(url, max_tokens=bench["max_tokens"], frames=bench["frames"], **kw)
                ok, why = well_formed(got, bench["frames"], kw.get("audio", True),
                                      text=kw.get("speech") is None)
                n = 0 if got["pcm"] is None else len(got["pcm"])
                numbers = (f"{got['tokens']} tokens, finish {got['finish']}, {n} samples = "
                           f"{audio_frames(n) if n else 0:g} frames" + (f"; {why}" if why else ""))
            except Exception as e:  # noqa: BLE001
                ok, numbers = False, f"{type(e).__name__}: {e}"
            res["answers"][name] = numbers
            chk.line("PASS" if ok else "FAIL", f"standin {name} well-formed", numbers)
        if not has_proc:
            chk.line("SKIP", "standin speech-in well-formed", "no processor files")
        base = chk.serve_levels = serve_bench(chk, url, shape, st, cfg, log=sr.log)
        if a.repeat_base:
            repeat_base(chk, url, shape, st, cfg, base, sr.log)
        if a.text_levels:
            text_only_bench(chk, url, shape, base)
        for name, overrides in a.ab:  # A/Bs of live fields: on these engines, no restart
            if (fields := live_fields(overrides)) is not None:
                standin_live_variant(chk, url, name, fields, base, shape, st, cfg, sr.log)
        if a.torch_profile:
            torch_profile(chk, url, shape, a.torch_profile)
        if a.torch_profile_text:
            torch_profile(chk, url, shape, a.torch_profile_text, text=True)
        if a.rates:
            poisson_bench(chk, url, shape)
        if a.realtime:
            realtime_bench(chk, url)
        for name, overrides in a.ab:  # A/Bs of stages' MPS shares: their engines replaced
            if engine_fields(overrides) is not None:
                if not standin_engine_variant(chk, url, name, overrides, base, shape, st, cfg,
                                              sr.log):
                    break  # an engine that did not come back: the app is not the base's now
    return base


def request_lengths(chk: Check) -> dict:
    """What every stand-in request asks for (serve_bench's options, and each result's setup):
    the device's max_tokens and frames, and ``--ignore-eos`` (every answer that long)."""
    b = BENCH[chk.args.device]
    return dict(max_tokens=b["max_tokens"], max_audio_frames=b["frames"],
                ignore_eos=chk.args.ignore_eos)


def text_only_bench(chk: Check, url: str, shape: str, base: list[dict]) -> None:
    """The same prompts with ``modalities: ["text"]`` at ``--text-levels``: the thinker with no
    speech stage beside it on the GPU. A line a level sets its step and text rate beside the
    base level's (with speech): what the talker and code2wav cost the thinker in the app ->
    ``gpu_serve.json``'s ``text_only``."""
    from benchmarks.serve_bench import bench

    a = chk.args
    by_c = {lv["concurrency"]: lv for lv in base}
    out = []
    for c in [int(x) for x in a.text_levels.split(",")]:
        if chk.left_s() < 30:
            chk.line("SKIP", f"text only c={c}", f"{chk.left_s():.0f}s left")
            continue
        run = bench(url, f"standin-{shape}-text", concurrency=str(c),
                    num_requests=a.num_requests, modalities="text", warmup=1,
                    **request_lengths(chk))[0]
        s, m = run["summary"], run["summary"]["metrics"]
        th = (run.get("step_profile") or {}).get("thinker") or {}
        lv = dict(concurrency=c, num_requests=s["num_requests"], num_ok=s["num_ok"],
                  ttft_p50_s=m["ttft"]["p50"], text_tok_s_p50=m["text_rate"]["p50"],
                  output_tokens_mean=m["output_tokens"]["mean"],
                  thinker_ms_per_step=th.get("ms_per_step"),
                  thinker_rows_per_step=th.get("requests_per_step"),
                  audio_seconds_mean=m["audio_seconds"]["mean"])
        out.append(lv)
        w = by_c.get(c) or {}
        wth = (w.get("step_profile") or {}).get("thinker") or {}
        ok = s["num_ok"] == s["num_requests"] and not lv["audio_seconds_mean"]
        chk.line("PASS" if ok else "FAIL", f"text only c={c}",
                 f"ok {s['num_ok']}/{s['num_requests']}, ttft p50 {_f(lv['ttft_p50_s'])}s, "
                 f"text {_f(lv['text_tok_s_p50'], 1)} tok/s p50 (with speech "
                 f"{_f(w.get('text_tok_s_p50'), 1)}), thinker {_f(th.get('ms_per_step'), 1)} ms "
                 f"a step ({_f(th.get('requests_per_step'), 1)} rows; with speech "
                 f"{_f(wth.get('ms_per_step'), 1)} ms, {_f(wth.get('requests_per_step'), 1)} "
                 f"rows), no audio: {not lv['audio_seconds_mean']}")
    path = a.out / "gpu_serve.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data["text_only"] = out
    write(path, data)


def engines_mps(chk: Check, url: str, cfg: dict, tag: str) -> dict:
    """Each engine's MPS environment (``/debug/stats``' ``mps``) is what its stage's
    ``engine_resources`` asks for: the SM shares and priorities an A/B compares are the ones
    its engines ran under. Returns the stats."""
    import httpx

    from omni_ray.config.serving import OmniServingArgs

    args = OmniServingArgs.model_validate(cfg["applications"][0]["args"])
    stats = httpx.get(f"{url}/debug/stats", timeout=60).json()
    got = {s: stats[s].get("mps") for s in STAGES}
    want = {s: getattr(args, s).engine_resources.env_vars() for s in STAGES}
    chk.line("PASS" if got == want else "FAIL", f"{tag} engines' MPS settings",
             ", ".join(f"{s} {got[s] or 'none'}" for s in STAGES)
             + ("" if got == want else f"; asked {want}"))
    return stats


# Issue 20's targets for the one-H200 Serve app (stand-in, 128 tokens, 150 frames):
# (concurrency, level key, target, "<=", "<", ">=" or "==")
TARGETS = [(1, "ttfa_p50_s", 0.150, "<="), (1, "rtf_p50", 0.15, "<="),
           (1, "text_tok_s_p50", 200.0, ">="),
           (8, "ttfa_p50_s", 0.300, "<="), (8, "rtf_p50", 0.15, "<="),
           (32, "ttfa_p50_s", 0.600, "<="), (32, "rtf_p50", 0.25, "<="), (32, "rtf_p99", 1.0, "<"),
           # "every stream real time" as a listener hears it: once its first audio plays, no
           # stream's playback runs dry (benchmarks/README.md "Definitions": stall, realtime)
           (32, "realtime_frac", 1.0, "==")]


_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, "==": operator.eq}


def targets(levels: list[dict]) -> list[dict]:
    """Each target against the measured level: name, value, target, met (levels not run left out)."""
    by_c = {lv["concurrency"]: lv for lv in levels}
    out = []
    for c, key, target, op in TARGETS:
        if c in by_c and by_c[c].get(key) is not None:
            v = by_c[c][key]
            out.append(dict(name=f"c={c} {key} {op} {target}", value=round(v, 4), target=target,
                            met=_OPS[op](v, target)))
    return out


REALTIME_FRAMES = 50  # benchmarks/realtime_bench.py's default bound on an answer's audio


def realtime_bench(chk: Check, url: str) -> None:
    """``WS /v1/realtime`` on the same app: end of speech -> first answer audio at the
    concurrency levels (benchmarks/realtime_bench.py) -> ``realtime_<device>.json`` in --out."""
    from benchmarks import realtime_bench as rb

    if chk.left_s() < 60:
        chk.line("SKIP", "realtime bench", f"{chk.left_s():.0f}s left")
        return
    conc = chk.args.concurrency or ",".join(map(str, BENCH[chk.args.device]["concurrency"]))
    out = chk.args.out.resolve() / f"realtime_{'gpu' if chk.args.device == 'cuda' else 'cpu'}"
    try:
        rc = rb.main(["--url", url, "--concurrency", conc, "--out", str(out)])
        got = json.loads(out.with_suffix(".json").read_text())
    except Exception as e:  # noqa: BLE001 - a FAIL line, the check goes on
        chk.line("FAIL", "realtime bench", f"{type(e).__name__}: {e}")
        return
    for lv in got["runs"]:
        ok = rc == 0 and lv["answered"] == lv["turns"] and not lv["socket_errors"]
        chk.line("PASS" if ok else "FAIL", f"realtime c={lv['concurrency']}",
                 f"end of speech -> first audio p50 {_f(lv['latency_p50_s'])}s p90 "
                 f"{_f(lv['latency_p90_s'])}s (vad {_f(lv['vad_delay_p50_s'])}s), "
                 f"{lv['answered']}/{lv['turns']} turns answered")


def profile_line(profile: dict) -> str:
    """One line of a level's step profile (benchmarks/step_profile.py): per stage steps/s,
    requests per step, ms per step, busy share, and the runner's parts in ms per step (a stage
    with several replicas: their steps summed, busy per replica)."""
    parts = []
    for stage, r in profile.items():
        n = r.get("replicas", 1)
        runner = " ".join(f"{k[:-2]}={v:.1f}"
                          for k, v in (r.get("runner_ms_per_step") or {}).items())
        name = f"{stage} ({n} replicas, split {r['rows_by_replica']})" if n > 1 else stage
        parts.append(f"{name}: {r['steps_per_s']:.0f} steps/s x{_f(r['requests_per_step'], 1)} "
                     f"{_f(r['ms_per_step'], 1)} ms/step busy {r['share']['step']:.0%} "
                     f"cmds {r['share']['commands']:.0%}" + _pushes(r)
                     + (f" [{runner}]" if runner else "")
                     + (f" first chunks held {r['first_chunks_held']}"
                        if r.get("first_chunks_held") else ""))
    return "; ".join(parts)


def _pushes(r: dict) -> str:
    """`` in 6924 chunks / 453 calls``: the chunks pushed into the stage and the actor calls
    that carried them (``pipeline.coalesce_pushes``); empty for a stage nothing pushes to."""
    if not r.get("chunks_in"):
        return ""
    return f" in {r['chunks_in']} chunks / {r.get('pushes_in', 0)} calls"


SHORT_PROMPT_TOKENS = 256  # "the others" of a long prompt: their first audio must not stall


def poisson_bench(chk: Check, url: str, shape: str) -> None:
    """Open loop: Poisson arrivals at each of ``--rates`` req/s, prompts of mixed length
    (log-uniform 32-2000 words); TTFA p50/p99 of all and of the short prompts (a long prefill
    must not stall the others' first audio) -> ``gpu_serve.json``'s ``poisson``."""
    from benchmarks.serve_bench import bench

    a = chk.args
    out = []
    for rate in [float(r) for r in a.rates.split(",")]:
        if chk.left_s() < 60:
            chk.line("SKIP", f"poisson {rate:g} req/s", f"{chk.left_s():.0f}s left")
            continue
        run = bench(url, f"standin-{shape}", request_rate=str(rate), prompts="mixed",
                    input_len_range=a.rate_prompt_words, num_requests=a.rate_requests,
                    warmup=0, **request_lengths(chk))[0]
        s, reqs = run["summary"], run["requests"]
        ok = [r for r in reqs if r["ok"] and r["ttfa"] is not None]
        short = [r["ttfa"] for r in ok if (r["prompt_tokens"] or 0) < SHORT_PROMPT_TOKENS]
        longp = [r["ttfa"] for r in ok if (r["prompt_tokens"] or 0) >= 1000]
        lv = dict(rate=rate, num_requests=s["num_requests"], num_ok=s["num_ok"],
                  ttfa_p50_s=_pct([r["ttfa"] for r in ok], 50),
                  ttfa_p99_s=_pct([r["ttfa"] for r in ok], 99),
                  short_prompt_ttfa_p99_s=_pct(short, 99), num_short=len(short),
                  long_prompt_ttfa_p50_s=_pct(longp, 50), num_long=len(longp),
                  prompt_tokens=[r["prompt_tokens"] for r in reqs],
                  rtf_p99=s["metrics"]["rtf"]["p99"], stall_p99_s=run["stall_p99_s"],
                  realtime_frac=run["realtime_frac"], audio_s_per_s=s["audio_seconds_per_s"])
        t_first = min((r["start"] for r in reqs), default=0.0)
        lv["requests"] = sorted(  # which request was slow: arrival, prompt, TTFA, RTF, stall
            (dict(t0_s=round(r["start"] - t_first, 3), prompt_tokens=r["prompt_tokens"],
                  ttfa_s=r["ttfa"], rtf=r["rtf"], stall_s=r["stall_s"]) for r in reqs),
            key=lambda r: r["t0_s"])
        out.append(lv)
        path = a.out / "gpu_serve.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data["poisson"] = out
        data["poisson_setup"] = dict(prompt_words=a.rate_prompt_words, **request_lengths(chk),
                                     short_prompt_tokens=SHORT_PROMPT_TOKENS)
        write(path, data)
        chk.line("PASS" if s["num_ok"] == s["num_requests"] else "FAIL", f"poisson {rate:g} req/s",
                 f"ok {s['num_ok']}/{s['num_requests']}, ttfa p50 {_f(lv['ttfa_p50_s'])}s p99 "
                 f"{_f(lv['ttfa_p99_s'])}s, short prompts ({len(short)}) p99 "
                 f"{_f(lv['short_prompt_ttfa_p99_s'])}s, long ({len(longp)}) p50 "
                 f"{_f(lv['long_prompt_ttfa_p50_s'])}s, rtf p99 {_f(lv['rtf_p99'])}, "
                 f"stall p99 {_f(lv['stall_p99_s'])}s, realtime {_f(lv['realtime_frac'], 2)}")


def _pct(xs: list[float], q: float) -> float | None:
    from benchmarks.metrics import percentile

    return percentile(xs, q) if xs else None


def with_overrides(cfg: dict, dotted: dict) -> dict:
    """``cfg`` with the app args' dotted overrides set (``pipeline.ramp_chunks`` ...)."""
    cfg = copy.deepcopy(cfg)
    app = cfg["applications"][0]
    app["args"] = set_dotted(app["args"], dotted)
    return cfg


def live_fields(overrides: dict) -> dict | None:
    """{field: value} when every override is a pipeline field a running app can change
    (``config/pipeline.LIVE_FIELDS``, ``POST /debug/pipeline``), else None (a restart)."""
    from omni_ray.config.pipeline import LIVE_FIELDS

    fields = {k.removeprefix("pipeline."): v for k, v in overrides.items()}
    if not overrides or any(not k.startswith("pipeline.") for k in overrides) or \
            not set(fields) <= set(LIVE_FIELDS):
        return None
    return fields


LIVE_VARIANT_S = 150  # what a live A/B variant needs of the budget: its bench only


def standin_live_variant(chk: Check, url: str, name: str, fields: dict, base: list[dict],
                         shape: str, st: dict, cfg: dict, log: Path | None) -> None:
    """An A/B of live pipeline fields on the base's running engines: the fields changed on
    every engine (``POST /debug/pipeline``), the same bench (``gpu_serve_<name>.json``), one line
    per level against the base, then the base's values back. No start: ~the bench's time."""
    import httpx

    from omni_ray.config.pipeline import PipelineConfig

    if chk.left_s() < LIVE_VARIANT_S:
        chk.line("SKIP", f"standin A/B {name}", f"{chk.left_s():.0f}s left, "
                 f"{LIVE_VARIANT_S}s needed")
        return
    args = cfg["applications"][0]["args"]
    base_cfg = PipelineConfig.model_validate(args.get("pipeline") or {})
    restore = {k: getattr(base_cfg, k) for k in fields}
    r = httpx.post(f"{url}/debug/pipeline", json=fields, timeout=120)
    engines = r.json() if r.status_code == 200 else {}
    ok = bool(engines) and all(all(live[k] == v for k, v in fields.items())
                               for stage in engines.values() for live in stage.values())
    chk.line("PASS" if ok else "FAIL", f"standin {name} live", (
        f"{fields} on {sum(len(v) for v in engines.values())} engines, no restart" if ok
        else f"HTTP {r.status_code}: {r.text[:300]}"))
    chk.data["phases"].setdefault("standin_ab", {})[name] = dict(
        overrides={f"pipeline.{k}": v for k, v in fields.items()}, live=True)
    if not ok:
        return
    try:
        levels = serve_bench(chk, url, shape, st, with_overrides(cfg, {
            f"pipeline.{k}": v for k, v in fields.items()}), tag=name, log=log)
    finally:  # the base's values back for what runs after (the other variants, profiles)
        back = httpx.post(f"{url}/debug/pipeline", json=restore, timeout=120)
        if back.status_code != 200:
            chk.line("FAIL", f"standin {name} live restore", f"HTTP {back.status_code}")
    chk.data["phases"]["standin_ab"][name]["levels"] = levels
    ab_lines(chk, name, base, levels)


def engine_fields(overrides: dict) -> dict[str, dict] | None:
    """{stage: {field: value}} when every override is a stage's MPS setting
    (``<stage>.engine_resources.mps_*``), which the running app takes by replacing that stage's
    engines (``POST /debug/engines``), else None (a restart)."""
    from omni_ray.config.serving import MPS_FIELDS

    out: dict[str, dict] = {}
    for key, value in overrides.items():
        stage, _, rest = key.partition(".")
        group, _, field = rest.partition(".")
        if stage not in STAGES or group != "engine_resources" or field not in MPS_FIELDS:
            return None
        out.setdefault(stage, {})[field] = value
    return out or None


ENGINE_VARIANT_S = 300  # a thinker's new engine (~100-150 s warm) and the bench (~100 s)


def standin_engine_variant(chk: Check, url: str, name: str, overrides: dict, base: list[dict],
                           shape: str, st: dict, cfg: dict, log: Path | None) -> bool:
    """An A/B of stages' MPS shares on the base's app: every stage an engine variant changed
    so far gets the base's settings with this variant's (``POST /debug/engines``; a replica
    already under them keeps its engine, the other stages keep theirs), its engines' MPS
    environment checked, the same bench (``gpu_serve_<name>.json``) and one line per level
    against the base. False when an engine did not come back."""
    import httpx

    from omni_ray.config.serving import MPS_FIELDS, OmniServingArgs

    if chk.left_s() < ENGINE_VARIANT_S:
        chk.line("SKIP", f"standin A/B {name}", f"{chk.left_s():.0f}s left, "
                 f"{ENGINE_VARIANT_S}s needed")
        return True
    args = OmniServingArgs.model_validate(cfg["applications"][0]["args"])
    chk.engine_stages |= set(engine_fields(overrides))
    changes = {s: {f: getattr(getattr(args, s).engine_resources, f) for f in MPS_FIELDS}
               for s in sorted(chk.engine_stages)}
    for s, fields in engine_fields(overrides).items():
        changes[s].update(fields)
    t0 = time.perf_counter()
    try:
        r = httpx.post(f"{url}/debug/engines", json=changes, timeout=1800)
        got, why = (r.json(), None) if r.status_code == 200 else ({}, f"HTTP {r.status_code}: "
                                                                     f"{r.text[:300]}")
    except httpx.HTTPError as e:
        got, why = {}, f"{type(e).__name__}: {e}"
    renewed = {s: [rep["seconds"] for rep in reps.values() if rep["renewed"]]
               for s, reps in got.items()}
    chk.data["phases"].setdefault("standin_ab", {})[name] = dict(
        overrides=overrides, engines=changes, engines_renewed_s=renewed)
    chk.line("PASS" if got else "FAIL", f"standin {name} engines renewed", why or (
        f"{', '.join(f'{s} {v}s' for s, v in renewed.items() if v) or 'none needed'} "
        f"(in {time.perf_counter() - t0:.0f}s; the other engines kept)"))
    if not got:
        return False
    vcfg = with_overrides(cfg, overrides)  # = the engines now: the others are the base's
    engines_mps(chk, url, vcfg, f"standin {name}")
    levels = serve_bench(chk, url, shape, st, vcfg, tag=name, log=log)
    chk.data["phases"]["standin_ab"][name]["levels"] = levels
    ab_lines(chk, name, base, levels)
    return True


VARIANT_S = 400  # what an A/B variant needs of the budget (standin_variant)
EXTRA_REPLICA_S = 100  # and each further replica of a stage (session 18: the second talker 75 s)


def standin_variant(chk: Check, base_cfg: dict, name: str, overrides: dict,
                    base: list[dict]) -> None:
    """An A/B in the same run: the stand-in app restarted with ``overrides``, the same bench
    (``gpu_serve_<name>.json``), and one line per level comparing it with the base."""
    # a warm restart (261-289 s on the H200, sessions 14-15) and the bench (~100 s): a variant
    # that starts with less left runs past the budget, and the device takes its files along
    overrides = dict(overrides)
    # not an app arg: the GPU shared through MPS (the base's choice unless the variant says)
    mps = bool(overrides.pop("mps", chk.base_mps))
    cfg = with_overrides(base_cfg, overrides)
    need = VARIANT_S + EXTRA_REPLICA_S * sum(n - 1 for n in extra_replicas(cfg).values())
    if chk.left_s() < need:
        chk.line("SKIP", f"standin A/B {name}", f"{chk.left_s():.0f}s left, {need}s needed")
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg["http_options"]["port"] = port
    chk.data["phases"].setdefault("standin_ab", {})[name] = dict(overrides=overrides, mps=mps)
    with contextlib.ExitStack() as stack:
        env = mps_env(chk, stack, name) if mps else None
        if mps and env is None:
            return
        sr, st = timed_start(chk, cfg, f"standin_{name}", url, chk.args.ray_stop, env=env)
        chk.data["phases"]["standin_ab"][name]["start"] = st
        if sr is None:
            chk.line("FAIL", f"standin {name} start", st["error"], log_tail=st["log_tail"])
            return
        with sr:
            chk.line("PASS", f"standin {name} start",
                     f"healthy {st['healthy_s']}s{every_engine(st)} "
                     f"({overrides}{', MPS' if mps else ''})")
            engines_mps(chk, url, cfg, f"standin {name}")
            levels = serve_bench(chk, url, chk.data["phases"]["standin"]["shape"], st, cfg,
                                 tag=name, log=sr.log)
    chk.data["phases"]["standin_ab"][name]["levels"] = levels
    ab_lines(chk, name, base, levels)


AB_KEYS = ("ttfa_p50_s", "ttfa_p99_s", "rtf_p50", "rtf_p99", "stall_p99_s", "realtime_frac",
           "audio_s_per_s")


def ab_lines(chk: Check, name: str, base: list[dict], levels: list[dict]) -> None:
    """One INFO line per level of variant ``name`` against the base's; with ``--repeat-base``,
    each number also beside the base's second measurement (``again X``): a variant's change
    means something only where it is larger than the base's own."""
    by_c = {lv["concurrency"]: lv for lv in base}
    again = {lv["concurrency"]: lv for lv in (chk.base_again or [])} if name != AGAIN else {}
    for lv in levels:
        b, b2 = by_c.get(lv["concurrency"]), again.get(lv["concurrency"])
        if b:
            chk.line("INFO", f"A/B {name} c={lv['concurrency']}", ", ".join(
                f"{k} {_f(b[k])} -> {_f(lv[k])}" + (f" (again {_f(b2[k])})" if b2 else "")
                for k in AB_KEYS))


AGAIN = "again"  # the base's second measurement (--repeat-base)


def repeat_base(chk: Check, url: str, shape: str, st: dict, cfg: dict, base: list[dict],
                log: Path | None) -> None:
    """The base's config benched a second time on the same app, right after its levels, at
    the variants' levels (``gpu_serve_again.json``): how far two runs of one config differ
    (session 26: a level of the base's config moved TTFA p50 by 74 ms and never-stalling from
    0.56 to 1.00 between two runs), printed beside every variant's numbers."""
    if chk.left_s() < LIVE_VARIANT_S:
        chk.line("SKIP", f"standin A/B {AGAIN}", f"{chk.left_s():.0f}s left, "
                 f"{LIVE_VARIANT_S}s needed")
        return
    levels = serve_bench(chk, url, shape, st, cfg, tag=AGAIN, log=log)
    chk.base_again = levels
    chk.data["phases"].setdefault("standin_ab", {})[AGAIN] = dict(overrides={}, live=True,
                                                                 levels=levels)
    ab_lines(chk, AGAIN, base, levels)


JIT_LINE = "JIT compilation during inference: "  # vLLM's kernel JIT monitor (a latency spike)


def jit_lines(log: Path | None, since: int) -> dict[str, int]:
    """{kernel: count} of the JIT compilations vLLM's monitor logged in the serve log after byte
    ``since`` (the app's configs log every one: ``jit_monitor_verbose``)."""
    if log is None or not log.exists():
        return {}
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    out: dict[str, int] = {}
    for line in text.splitlines():
        if JIT_LINE in line:
            name = line.split(JIT_LINE, 1)[1].split(".", 1)[0].split(" (", 1)[0].strip()
            out[name] = out.get(name, 0) + 1
    return out


def _log_size(log: Path | None) -> int:
    return log.stat().st_size if log is not None and log.exists() else 0


def serve_bench(chk: Check, url: str, shape: str, st: dict, cfg: dict, tag: str = "",
                log: Path | None = None) -> list[dict]:
    """The Serve benchmark at every concurrency level -> ``gpu_serve.json`` (a ``tag``ged A/B
    variant: ``gpu_serve_<tag>.json``, its lines named with the tag); the levels run.
    ``log``: the app's serve log, for the kernel JITs each level met (``kernel_jits``)."""
    from benchmarks.serve_bench import bench

    a, b = chk.args, BENCH[chk.args.device]
    levels_arg = (a.ab_concurrency or a.concurrency) if tag else a.concurrency
    conc = [int(c) for c in levels_arg.split(",")] if levels_arg else b["concurrency"]
    args = cfg["applications"][0]["args"]
    setup = dict(config=str(BASE_CONFIG.relative_to(REPO_ROOT)), shape=shape,
                 model=args["model"], **request_lengths(chk),
                 num_requests=a.num_requests or "max(2 x concurrency, 8)",
                 warmup_burst=a.warmup_burst,
                 pipeline=args["pipeline"], thinker=args["thinker"], talker=args["talker"],
                 note=("ignore_eos: every answer max_tokens long, its audio max_audio_frames"
                       if a.ignore_eos else "without ignore_eos: output_tokens_mean and "
                       "audio_seconds_mean are what came"))
    levels, sfx = [], f" {tag}" if tag else ""
    for c in conc:
        if chk.left_s() < 30:
            chk.line("SKIP", f"serve bench{sfx} c={c}", f"{chk.left_s():.0f}s left")
            continue
        mark = _log_size(log)
        run = bench(url, f"standin-{shape}", concurrency=str(c), num_requests=a.num_requests,
                    warmup=0 if a.warmup_burst else 1, warmup_burst=a.warmup_burst,
                    **request_lengths(chk))[0]
        jits = jit_lines(log, mark)
        s, m = run["summary"], run["summary"]["metrics"]
        lv = dict(concurrency=c, ttft_p50_s=m["ttft"]["p50"], ttfa_p50_s=m["ttfa"]["p50"],
                  ttfa_p99_s=m["ttfa"]["p99"], rtf_p50=m["rtf"]["p50"], rtf_p99=m["rtf"]["p99"],
                  text_rtf_p50=m["text_rtf"]["p50"],
                  stall_p99_s=run["stall_p99_s"], realtime_frac=run["realtime_frac"],
                  e2e_p50_s=m["e2e"]["p50"], text_tok_s=s["output_tokens_per_s"],
                  text_tok_s_p50=m["text_rate"]["p50"],
                  audio_s_per_s=s["audio_seconds_per_s"], num_requests=s["num_requests"],
                  num_ok=s["num_ok"], output_tokens_mean=m["output_tokens"]["mean"],
                  audio_seconds_mean=m["audio_seconds"]["mean"], wall_s=s["wall_s"],
                  stall_where=s.get("stall_where"))
        lv["step_profile"] = run.get("step_profile")
        lv["kernel_jits"] = jits
        if jits:  # each a stall of the stage that met a new shape (runners/vllm/kernel_warmup.py)
            chk.line("INFO", f"kernel JITs in traffic{sfx} c={c}", ", ".join(
                f"{k} x{n}" for k, n in sorted(jits.items())))
        t_first = min(r["start"] for r in run["requests"])
        lv["requests"] = sorted(  # which requests were slow: start offset, client TTFA, RTF,
            (dict(t0_s=round(r["start"] - t_first, 3), ttfa_s=r["ttfa"], rtf=r["rtf"],
                  text_rtf=r.get("text_rtf"),
                  stall_s=r["stall_s"], stalls=r.get("stalls"), audio_s=r["audio_seconds"],
                  e2e_s=r["e2e"], request_id=r["request_id"])
             for r in run["requests"]), key=lambda r: r["t0_s"])  # audio and end (RTF's parts)
        lv["ttfa_requests"] = run.get("ttfa_requests")
        lv["ttfa_requests_missing"] = run.get("ttfa_requests_missing")
        bd = lv["ttfa_breakdown"] = run.get("ttfa_breakdown") or {}
        from benchmarks.timeline import SEGMENTS

        complete = all(name in bd for name, _, _ in SEGMENTS)  # every stage noted its milestones
        chk.line("PASS" if complete else "FAIL", f"ttfa breakdown{sfx} c={c}", "p50 ms: " + ", ".join(
            f"{k.split(':')[0]} {v['p50'] * 1e3:.0f}" for k, v in bd.items()))
        ib = lv["ttfa_ingress_breakdown"] = run.get("ttfa_ingress_breakdown") or {}
        if ib:  # the ingress segment's parts (benchmarks/timeline.py INGRESS_PARTS)
            chk.line("INFO", f"ingress breakdown{sfx} c={c}", "p50 ms: " + ", ".join(
                f"{k} {v['p50'] * 1e3:.1f}" for k, v in ib.items()))
        if lv["step_profile"]:
            chk.line("INFO", f"step profile{sfx} c={c}", profile_line(lv["step_profile"]))
        tr = lv["step_trace"] = run.get("step_trace")
        if tr:  # the slow steps a mean hides, and the steps that released first chunks
            from benchmarks import step_trace

            chk.line("INFO", f"slowest steps{sfx} c={c}", step_trace.slow_line(tr))
            if tr.get("talker_releases"):
                chk.line("INFO", f"talker first chunks by step{sfx} c={c}",
                         step_trace.releases_line(tr))
            if tr.get("talker_opening"):
                chk.line("INFO", f"talker opening burst{sfx} c={c}", step_trace.opening_line(tr))
            if shapes := step_trace.shapes_line(tr):  # what a shape met first costs
                chk.line("INFO", f"new shapes{sfx} c={c}", shapes)
        if slow := slower_than_realtime(lv["requests"]):  # what an RTF p99 over 1 is made of
            chk.line("INFO", f"streams of RTF >= 1{sfx} c={c}", slow)
        if lv["stall_where"]:  # which chunk came late: requests waiting there, mean wait
            chk.line("INFO", f"stalls by audio played{sfx} c={c}", ", ".join(
                f"{k} {_f(v['requests_frac'], 2)} ({v['mean_wait_s'] * 1e3:.0f} ms)"
                for k, v in lv["stall_where"].items()))
        levels.append(lv)
        write(a.out / (f"gpu_serve_{tag}.json" if tag else "gpu_serve.json"), dict(
            commit=chk.data["commit"], dirty=chk.data["dirty"], device=chk.data["device"],
            setup=setup, serve_run_to_healthy_s=st["healthy_s"],
            serve_run_to_first_answer_s=st["first_answer_s"], levels=levels,
            targets=targets(levels)))
        ok = s["num_ok"] == s["num_requests"]
        chk.line("PASS" if ok else "FAIL", f"serve bench{sfx} c={c}",
                 f"ok {s['num_ok']}/{s['num_requests']}, ttft p50 {_f(lv['ttft_p50_s'])}s, "
                 f"ttfa p50 {_f(lv['ttfa_p50_s'])}s p99 {_f(lv['ttfa_p99_s'])}s, rtf p50 "
                 f"{_f(lv['rtf_p50'])} p99 {_f(lv['rtf_p99'])} (text's end "
                 f"{_f(lv['text_rtf_p50'])}), stall p99 "
                 f"{_f(lv['stall_p99_s'])}s, realtime {_f(lv['realtime_frac'], 2)}, "
                 f"{lv['text_tok_s']:.1f} tok/s, "
                 f"{lv['audio_s_per_s']:.2f} audio s/s, {_f(lv['output_tokens_mean'], 1)} "
                 f"tokens/request")
    return levels


PROFILE_AFTER_S, PROFILE_TIMEOUT_S = 3.0, 60.0  # load before the captures; their longest wait


def torch_profile(chk: Check, url: str, shape: str, c: int, text: bool = False) -> None:
    """One more load level at concurrency ``c``, not counted among the levels: while it runs, a
    ``torch.profiler`` capture of every stage engine's next steps (``GET /debug/profile``) ->
    ``gpu_profile.json`` (ops by device and host time per step, the host's waits for the device,
    and each stage's table) and a line per stage with its top ops and the device's busy time a
    step. Then a second capture with Python stacks (``stacks``: slower steps, so counts, not
    times) -> ``call_sites``, and a line per stage naming where its waits are made. ``text``:
    text-only answers and the thinker alone (``gpu_profile_text.json``): its step with no speech
    stage on the GPU, split into device time and the rest."""
    import threading

    from benchmarks.serve_bench import bench

    if chk.left_s() < 90:
        chk.line("SKIP", f"torch profile{' text' if text else ''} c={c}",
                 f"{chk.left_s():.0f}s left")
        return
    b = BENCH[chk.args.device]
    captured = threading.Event()
    stages, name = (("thinker",), f"torch profile text c={c}") if text else (
        STAGES, f"torch profile c={c}")

    def load() -> None:  # waves of c requests until every capture has its steps
        while not captured.is_set():
            bench(url, f"standin-{shape}-profiled", concurrency=str(c), num_requests=c,
                  warmup=0, modalities="text" if text else "text,audio", **request_lengths(chk))

    loader = threading.Thread(target=load)
    loader.start()
    time.sleep(PROFILE_AFTER_S)
    try:
        got = _profiles(chk, url, stages, name, b["profile_steps"], stacks=False)
        sites = _profiles(chk, url, stages, f"{name} call sites",  # counts: fewer steps do
                          max(1, b["profile_steps"] // 4), stacks=True)
    finally:
        captured.set()
        loader.join()
    for stage, p in got.items():
        top = p["top_device"] or p["top_host"]
        key = "device_ms_per_step" if p["top_device"] else "host_ms_per_step"
        busy = (f", device busy {p['device_ms_per_step_total']:.2f} ms/step"
                if p["top_device"] else "")
        waits = "; waits " + (", ".join(f"{o['op']} {o['host_ms_per_step']:.2f}"
                                        for o in p["waits"]) or "none")
        chk.line("PASS" if p["steps"] else "FAIL", f"{name} {stage}",
                 f"{p['steps']} steps, {p['ms_per_step']:.1f} ms/step (profiled){busy}; "
                 f"{key.split('_')[0]} ms/step: " + ", ".join(
                     f"{o['op'][:48]} {o[key]:.2f}" for o in top[:6]) + waits)
    for stage, p in sites.items():
        chk.line("PASS" if p["steps"] else "FAIL", f"{name} call sites {stage}",
                 f"{p['steps']} steps, waits a step: " + ("; ".join(
                     f"{w['op']} x{w['calls_per_step']:.2f} at {' < '.join(w['where'][1:3])}"
                     for w in p["waits"][:4]) or "none"))
    write(chk.args.out / f"gpu_profile{'_text' if text else ''}.json", dict(
        commit=chk.data["commit"], device=chk.data["device"], concurrency=c, text_only=text,
        steps_asked=b["profile_steps"], stages=got,
        call_sites={stage: dict(steps=p["steps"], ms_per_step=p["ms_per_step"],
                                waits=p["waits"]) for stage, p in sites.items()}))


def _profiles(chk: Check, url: str, stages, name: str, steps: int, stacks: bool) -> dict:
    """``GET /debug/profile`` of every stage in ``stages`` over the same steps; a FAIL line for
    a stage whose capture failed."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    with ThreadPoolExecutor(len(stages)) as ex:  # the summary can take minutes on CPU
        asked = {s: ex.submit(httpx.get, f"{url}/debug/profile", timeout=600, params=dict(
            stage=s, steps=steps, timeout_s=PROFILE_TIMEOUT_S, stacks=stacks)) for s in stages}
    got = {}
    for stage, fut in asked.items():
        try:
            r = fut.result()
            r.raise_for_status()
            got[stage] = r.json()
        except Exception as e:  # noqa: BLE001
            chk.line("FAIL", f"{name} {stage}", f"{type(e).__name__}: {e}")
    return got


def phase_offline(chk: Check) -> None:
    a = chk.args
    out = a.out / "offline"
    cmd = [sys.executable, "-m", "benchmarks.gpu_run", "--phase", "realsize", "--out", str(out),
           "--device", a.device, "--time-budget", str(max(60, int(chk.left_s()) - 30))]
    if a.device == "cpu":
        cmd += ["--smoke", "--concurrency", "1", "2"]
    t = time.perf_counter()
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    with open(a.out / "logs" / "offline.log", "wb") as log:
        rc = subprocess.run(cmd, cwd=REPO_ROOT, env=child_env(), stdout=log,
                            stderr=subprocess.STDOUT).returncode
    found = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("gpu_realsize*.json"))}
    chk.data["phases"]["offline"] = dict(rc=rc, results=found)
    chk.line("PASS" if rc == 0 and found else "FAIL", "offline realsize",
             f"rc {rc}, {len(found)} result file(s), {time.perf_counter() - t:.0f}s",
             log_tail=tail(a.out / "logs" / "offline.log") if rc else None)


def phase_code2wav(chk: Check) -> None:
    """The code2wav stage's batched step vs one forward per stream, at the released shape in the
    served dtype (``benchmarks.code2wav_batch_bench``), and the two answers compared in float32
    (TF32 off) -> ``code2wav_batch_<device>.json``."""
    import torch

    from benchmarks import code2wav_batch_bench as cb

    dev = chk.args.device
    cuda = dev == "cuda"
    setup, frames, counts = ("real", 100, "1,8,32") if cuda else ("tiny", 30, "1,4")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    exact = cb.main(["--setup", setup, "--device", dev, "--dtype", "float32", "--requests", "4",
                     "--frames", str(frames // 2), "--out", "scratch.json",
                     "--out-dir", str(chk.tmp)])["results"][0]
    diff = exact["max_abs_diff_rel_peak"]
    chk.line("PASS" if diff < 1e-4 else "FAIL", f"code2wav batched == one by one ({dev} fp32)",
             f"4 streams x {frames // 2} frames, max diff {diff:.1e} of peak")
    dtype = "bfloat16" if cuda else "float32"
    rep = cb.main(["--setup", setup, "--device", dev, "--dtype", dtype, "--requests", counts,
                   "--frames", str(frames), "--out-dir", str(chk.args.out),
                   "--out", f"code2wav_batch_{'gpu' if cuda else 'cpu'}.json"])
    rep["float32_check"] = exact
    chk.data["phases"]["code2wav"] = rep
    for r in rep["results"]:
        chk.line("INFO", f"code2wav batched vs one by one, {r['requests']} streams",
                 cb.line(r))


def phase_codepred(chk: Check) -> None:
    """The talker's code predictor per frame in its CUDA graphs at the released shape, greedy
    and sampled, fused or not, sampled among the candidates or the whole codebook
    (``benchmarks/code_predictor_bench.py``) -> ``code_predictor_gpu.json`` (CUDA only)."""
    if chk.args.device != "cuda":
        chk.line("SKIP", "code predictor graphs A/B", "CUDA graphs: cuda only")
        return
    from benchmarks import code_predictor_bench

    res = code_predictor_bench.main(["--batches", "1,8,32", "--out-dir", str(chk.args.out)]
                                    + (["--compile", "--modes", chk.args.codepred_modes]
                                       if chk.args.codepred_modes else []))
    chk.data["phases"]["codepred"] = res
    for mode, m in res["modes"].items():
        same = m.get("codes_equal_fraction")
        chk.line("INFO", f"code predictor graph {mode}", ", ".join(
            f"b={b} {ms} ms (x{res['speedup_vs_greedy'][mode][b]})"
            for b, ms in m["ms_per_frame"].items())
            + ("" if same is None else ", codes equal " + ", ".join(
                f"{v:.3f}" for v in same.values())))


DECODE_S = 240  # what the decode phase needs of the budget per weight format (a cold start)


def phase_decode(chk: Check) -> None:
    """Plain vLLM decoding the stand-in's thinker backbone alone on the device
    (``benchmarks/thinker_decode_bench.py``; list it after ``standin``: it needs the app down) at
    the stand-in levels' batch sizes -> ``thinker_decode.json``. After the stand-in, an INFO line
    a level sets the app's thinker step beside the plain engine's at that batch, and gives the
    RTF the text alone allows at the plain engine's pace: the talker speaks the text as it
    streams, so no speech-stage change takes a level's RTF below it."""
    from benchmarks import thinker_decode_bench

    a, dev = chk.args, chk.args.device
    formats = [q for q in a.decode_formats.split(",") if q]
    if chk.left_s() < DECODE_S * len(formats):
        chk.line("SKIP", "thinker decode alone", f"{chk.left_s():.0f}s left, "
                 f"{DECODE_S * len(formats)} needed")
        return
    by_c = {lv["concurrency"]: lv for lv in getattr(chk, "serve_levels", None) or []}
    batches = sorted(by_c) or BENCH[dev]["concurrency"]
    out = a.out / "thinker_decode.json"
    argv = ["--batches", ",".join(map(str, batches)), "--quantization", ",".join(formats),
            "--out", str(out)]
    argv += ["--smoke"] if dev == "cpu" else ["--shape", a.shape or "qwen3-omni-30b-a3b"]
    argv += ["--routing"] if set(formats) - {"none"} else []  # is a format's routing real?
    thinker_decode_bench.main(argv)
    res = json.loads(out.read_text())
    chk.data["phases"]["decode"] = res
    for e in res["errors"]:
        chk.line("FAIL", f"thinker decode alone {e['quantization']}", f"rc {e['rc']}",
                 log_tail=e["tail"])
    for f in res["formats"]:
        chk.line("PASS", f"thinker decode alone {f['quantization']}", ", ".join(
            f"b={b} {v['step_ms']:.2f} ms ({v['tok_s']:.0f} tok/s"
            + (f", {v['distinct_experts'] or 'unrecorded'} experts a layer, "
               f"{v['distinct_experts_uniform']} if random" if "distinct_experts" in v else "")
            + ")"
            for b, v in f["levels"].items()) + f"; start {f['start_s']}s")
    alone = next((f["levels"] for f in res["formats"] if f["quantization"] == "none"), None)
    for name in [v for v in a.decode_variants.split(",") if v]:
        decode_variant(chk, name, batches, alone)
    for c, lv in sorted(by_c.items()):
        th = (lv.get("step_profile") or {}).get("thinker") or {}
        ref = (alone or {}).get(str(c))
        if not (ref and th.get("ms_per_step") and lv.get("audio_seconds_mean")):
            continue
        text_s = lv["ttft_p50_s"] + (lv["output_tokens_mean"] - 1) * ref["step_ms"] / 1000
        chk.line("INFO", f"thinker in the app vs alone c={c}",
                 f"{th['ms_per_step']:.1f} ms a step ({_f(th.get('requests_per_step'), 1)} rows) "
                 f"vs {ref['step_ms']:.1f} ms alone at batch {c} "
                 f"(x{th['ms_per_step'] / ref['step_ms']:.2f}); the text at the alone pace "
                 f"allows RTF >= {text_s / lv['audio_seconds_mean']:.3f} (measured "
                 f"{_f(lv['rtf_p50'])}, text's end {_f(lv.get('text_rtf_p50'))})")


def parse_decode_variant(name: str) -> list[str]:
    """``sm50``, ``inproc`` or both (``sm50+inproc``) -> thinker_decode_bench's flags."""
    flags = []
    for part in name.split("+"):
        if part == "inproc":
            flags.append("--in-process")
        elif part.startswith("sm") and part[2:].isdigit() and 1 <= int(part[2:]) <= 100:
            flags += ["--sm-percent", part[2:]]
        else:
            raise ValueError(f"decode variant {part!r}: sm<1-100>, inproc, or both joined by +")
    return flags


def decode_variant(chk: Check, name: str, batches: list[int], alone: dict | None) -> None:
    """The plain engine again, bf16, where the app's thinker is (``--decode-variants``): under
    an SM cap (MPS) and/or with its engine core in process -> ``thinker_decode_<name>.json``
    and a line a batch against the plain engine on the whole GPU."""
    from benchmarks import thinker_decode_bench

    a, dev = chk.args, chk.args.device
    if chk.left_s() < DECODE_S:
        chk.line("SKIP", f"thinker decode alone {name}", f"{chk.left_s():.0f}s left, "
                 f"{DECODE_S} needed")
        return
    out = a.out / f"thinker_decode_{name}.json"
    argv = ["--batches", ",".join(map(str, batches)), "--quantization", "none", "--out", str(out),
            *parse_decode_variant(name)]
    argv += ["--smoke"] if dev == "cpu" else ["--shape", a.shape or "qwen3-omni-30b-a3b"]
    try:
        thinker_decode_bench.main(argv)
        res = json.loads(out.read_text())
    except Exception as e:  # noqa: BLE001 - e.g. no MPS here: a FAIL line, the check goes on
        chk.line("FAIL", f"thinker decode alone {name}", f"{type(e).__name__}: {e}")
        return
    chk.data["phases"].setdefault("decode_variants", {})[name] = res
    for e in res["errors"]:
        chk.line("FAIL", f"thinker decode alone {name}", f"rc {e['rc']}", log_tail=e["tail"])
    for f in res["formats"]:
        chk.line("PASS", f"thinker decode alone {name}", ", ".join(
            f"b={b} {v['step_ms']:.2f} ms"
            + (f" (x{v['step_ms'] / alone[b]['step_ms']:.2f} the whole GPU's)"
               if alone and b in alone else "")
            for b, v in f["levels"].items())
            + f"; sm_percent {f['sm_percent']}, in_process {f['in_process']}")


def phase_batch(chk: Check) -> None:
    """``omni-ray batch`` (Ray Data, one actor per stage) on the stand-in with the yaml's engines,
    over the prompts the Serve bench sends, 4 x its top concurrency rows -> ``batch_gpu.json``:
    every row once and without error; rows/s and audio s/s beside the Serve app's top level."""
    import pyarrow.parquet as pq

    from benchmarks.serve_bench import make_prompts

    a, dev = chk.args, chk.args.device
    b = BENCH[dev]
    st = chk.data["phases"].get("standin") or {}
    shape = a.shape or ("smoke" if dev == "cpu" else "qwen3-omni-30b-a3b")
    model, has_proc = ((st["model"], st["processor"]) if st.get("model") else
                       make_checkpoint("dummy", chk.tmp / "standin", shape, not a.no_processor))
    cfg = app_config(model, dev, free_port(), tiny=False, dummy=True, processor=has_proc)
    top = max(int(c) for c in a.concurrency.split(",")) if a.concurrency else max(
        b["concurrency"])
    rows = [dict(id=f"r{i}", messages=[{"role": "user", "content": p}],
                 max_tokens=b["max_tokens"], max_audio_frames=b["frames"])
            for i, p in enumerate(make_prompts("fixed", 4 * top, 32, 0))]
    work = chk.tmp / "batch"
    work.mkdir(exist_ok=True)
    inp = work / "rows.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "omni_ray.cli", "batch", "--config",
           str(write_config(cfg, a.out / "configs" / "batch.yaml")), "--input", str(inp),
           "--output", str(work / "out"), "--batch-size", str(top), "--audio-format", "flac"]
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    log = a.out / "logs" / "batch.log"
    t = time.perf_counter()
    with open(log, "wb") as f:
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE,
                                  stderr=f, timeout=max(60, chk.left_s() - 20))
        except subprocess.TimeoutExpired:
            subprocess.run(["ray", "stop", "--force"], env=child_env(), capture_output=True)
            chk.line("SKIP", "batch job", f"time budget: cut after {time.perf_counter() - t:.0f}s")
            return
    wall = time.perf_counter() - t
    if proc.returncode:
        chk.line("FAIL", "batch job", f"rc {proc.returncode}", log_tail=tail(log))
        return
    summary = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    table = pq.read_table(str(work / "out")).drop_columns(["audio"]).to_pylist()
    busy = {s: sum({r[f"{s}_batch_s"] for r in table} - {None})  # each batch's time, once
            for s in STAGES}
    # Steady state, without the engines' start: the rows after the first file (blocks are
    # written as they finish) over the time from the first file to the last.
    files = sorted((f.stat().st_mtime, pq.read_metadata(f).num_rows)
                   for f in (work / "out").glob("*.parquet"))
    span = files[-1][0] - files[0][0] if len(files) > 1 else 0.0
    steady = (sum(n for _, n in files[1:]) / span) if span > 0 else None
    serve = next((lv for lv in chk.serve_levels if lv["concurrency"] == top), None)
    res = dict(setup=dict(config="batch.yaml (the standin's)", rows=len(rows), batch_size=top,
                          max_tokens=b["max_tokens"], max_audio_frames=b["frames"],
                          actors_per_stage=1), summary=summary, job_wall_s=round(wall, 1),
               stage_busy_s=busy, rows_per_busiest_stage_s=len(table) / max(busy.values()),
               files=len(files), rows_per_s_after_first_file=steady,
               audio_s_per_s_after_first_file=None if steady is None else
               steady * summary["audio_seconds"] / summary["rows"],
               audio_s_per_s_incl_start=summary["audio_seconds"] / summary["wall_s"],
               serve_top_level=None if serve is None else dict(
                   concurrency=top, rows_per_s=serve["num_requests"] / serve["wall_s"],
                   audio_s_per_s=serve["audio_s_per_s"]))
    chk.data["phases"]["batch"] = res
    write(a.out / f"batch_{'gpu' if dev == 'cuda' else 'cpu_check'}.json", res)
    ok = (summary["rows"] == len(rows) and summary["errors"] == 0
          and summary["duplicates"] == 0)
    chk.line("PASS" if ok else "FAIL", "batch job rows",
             f"{summary['rows']}/{len(rows)} rows, {summary['errors']} errors, "
             f"{summary['duplicates']} duplicates, {summary['audio_seconds']:.0f} audio s")
    after = ("n/a (one file)" if steady is None else
             f"{steady:.2f} rows/s, {res['audio_s_per_s_after_first_file']:.1f} audio s/s")
    chk.line("INFO", "batch throughput",
             f"after the first file {after}; {summary['rows_per_s']:.2f} rows/s with the "
             f"engines' start ({summary['wall_s']:.0f}s); stage busy s "
             + ", ".join(f"{k} {v:.1f}" for k, v in busy.items())
             + (f"; Serve c={top}: {res['serve_top_level']['rows_per_s']:.2f} rows/s, "
                f"{serve['audio_s_per_s']:.1f} audio s/s" if serve else ""))


PHASES = {"tiny": phase_tiny, "code2wav": phase_code2wav, "codepred": phase_codepred,
          "standin": phase_standin, "batch": phase_batch, "offline": phase_offline,
          "decode": phase_decode}


def _f(v, nd=3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def git(*cmd) -> str:
    try:
        return subprocess.run(["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def versions() -> dict:
    out = {}
    for mod in ("torch", "vllm", "ray", "transformers", "openai", "httpx", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: recorded as None
            out[mod] = None
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    ap.add_argument("--phases", default="tiny,standin",
                    help="comma list of code2wav,codepred,tiny,standin,batch,offline,decode")
    ap.add_argument("--tiny-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="tiny phase on cuda: float32 compares exactly with the offline "
                         "pipeline; bfloat16 (the yaml's) with the bf16 allowance")
    ap.add_argument("--restarts", type=int, default=None, help="tiny starts (cuda 3, cpu 1)")
    ap.add_argument("--serve-timeout", type=float, default=None,
                    help="seconds from `serve run` to /health OK (cuda 600, cpu 300)")
    ap.add_argument("--time-budget", type=float, default=3600,
                    help="seconds; phases and levels past it print SKIP")
    ap.add_argument("--shape", default=None, help="standin shape (cuda qwen3-omni-30b-a3b, "
                    "cpu smoke; qwen3-omni-30b-a3b-half-thinker is sized for an 80 GB H100, "
                    "for A/Bs of the speech stages: omni_ray/models/dummy.py)")
    ap.add_argument("--ab", type=parse_variant, action="append", default=[],
                    metavar="NAME:key.path=value[,...]",
                    help="after the standin bench, restart it with these app args and bench "
                         "again (an A/B in one run), e.g. "
                         "ramp:pipeline.ramp_chunks=true,pipeline.initial_chunk_frames=1; "
                         "the key mps=true runs the variant under an MPS daemon (omni_ray/mps.py). "
                         "A variant of live pipeline fields only (config/pipeline.LIVE_FIELDS, "
                         "e.g. pushone:pipeline.coalesce_pushes=false) runs on the base's "
                         "engines right after its bench, without a restart; one of stages' MPS "
                         "shares only (<stage>.engine_resources.mps_*, e.g. "
                         "c2wlow:code2wav.engine_resources.mps_low_priority=true) on the base's "
                         "app too, only those stages' engines replaced, after the base's "
                         "profiles and open-loop levels")
    ap.add_argument("--standin-set", default="", metavar="key.path=value[,...]",
                    help="the standin phase's app args changed before it starts (no A/B); "
                         "mps=true runs it under an MPS daemon, and the --ab variants too "
                         "unless they say mps=false")
    ap.add_argument("--rates", default="", help="after the standin bench: Poisson arrivals at "
                    "these req/s with mixed prompt lengths, e.g. 1,2,4")
    ap.add_argument("--text-levels", default="", help="after the standin bench: the same "
                    "prompts answered in text only at these concurrencies, e.g. 1,8,32 (the "
                    "thinker's step without the speech stages beside it)")
    ap.add_argument("--rate-requests", type=int, default=24, help="requests per rate")
    ap.add_argument("--rate-prompt-words", default="32,2000",
                    help="mixed prompts: words per prompt, log-uniform in LO,HI")
    ap.add_argument("--concurrency", default="", help="standin bench levels (cuda 1,8,32; cpu 1,2); "
                    "a level named twice runs twice (the first burst of 32 is the engines' first)")
    ap.add_argument("--ab-concurrency", default="", help="the --ab variants' levels (default: "
                    "--concurrency's), e.g. 8,32 to spend a short device lease on the levels a "
                    "variant is for")
    ap.add_argument("--decode-formats", default="none",
                    help="decode phase: weight formats, 'none' (the dtype) or vLLM "
                         "quantizations, e.g. none,fp8")
    ap.add_argument("--decode-variants", default="",
                    help="decode phase: the bf16 plain engine again where the app's thinker "
                         "is: sm<P> (under MPS at P%% of the SMs), inproc (its engine core in "
                         "process), or both joined by +, e.g. sm50,sm50+inproc")
    ap.add_argument("--codepred-modes", default="", help="codepred phase: only these modes of "
                    "benchmarks/code_predictor_bench.py, compiled ones included (default: the "
                    "eager-graph modes)")
    ap.add_argument("--torch-profile", type=int, default=0, metavar="C",
                    help="standin: after the bench, one more level at concurrency C with a "
                         "torch.profiler capture of every stage's steps, then one with "
                         "Python stacks naming where each waits for the device "
                         "(gpu_profile.json)")
    ap.add_argument("--torch-profile-text", type=int, default=0, metavar="C",
                    help="standin: a text-only level at concurrency C with a torch.profiler "
                         "capture of the thinker's steps alone (gpu_profile_text.json)")
    ap.add_argument("--realtime", action="store_true", help="standin: also the realtime bench "
                    "(WS /v1/realtime, benchmarks/realtime_bench.py) on the same app")
    ap.add_argument("--num-requests", type=int, default=0,
                    help="per level; 0: max(2 x concurrency, 8)")
    ap.add_argument("--repeat-base", action="store_true",
                    help="bench the base a second time right after its levels, at the variants' "
                    "levels (gpu_serve_again.json), and print its numbers beside every A/B "
                    "line: the spread of one config between two runs")
    ap.add_argument("--warmup-burst", action=argparse.BooleanOptionalAction, default=True,
                    help="before each standin level (base and variants alike), one unmeasured "
                    "request per client at once: the first arm of an A/B no longer pays for "
                    "the shapes the app meets first (session 26: code2wav's steps at c=8 took "
                    "54 ms in the base's first levels, 25-34 ms in the variants' after it)")
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                    help="the stand-in's requests with ignore_eos: every answer max_tokens "
                    "long, its audio max_audio_frames (session 34: four random-weight answers "
                    "ended their audio after 0.2-3.9 s, and the two shortest made c=32's RTF "
                    "p99 1.39 with no stall)")
    ap.add_argument("--no-processor", action="store_true",
                    help="tiny checkpoint without processor files (as without torchvision)")
    ap.add_argument("--ray-stop", dest="ray_stop", action="store_true", default=None,
                    help="`ray stop --force` after each start (default on cuda: a machine of "
                         "its own; never on a shared CPU box, it ends everyone's Ray)")
    ap.add_argument("--no-ray-stop", dest="ray_stop", action="store_false")
    ap.add_argument("--commit", default="", help="the commit the tree is at, where git cannot "
                    "say (a copied tree); default: git rev-parse HEAD")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    a.restarts = a.restarts if a.restarts is not None else (3 if cuda else 1)
    a.serve_timeout = a.serve_timeout or (600 if cuda else 300)
    a.ray_stop = cuda if a.ray_stop is None else a.ray_stop
    unknown = set(a.phases.split(",")) - set(PHASES)
    if unknown:
        ap.error(f"unknown phase(s) {sorted(unknown)}; known: {list(PHASES)}")
    for name in [v for v in a.decode_variants.split(",") if v]:
        try:
            parse_decode_variant(name)
        except ValueError as e:
            ap.error(f"--decode-variants: {e}")
    if a.repeat_base and any(name == AGAIN for name, _ in a.ab):
        ap.error(f"--ab {AGAIN}: that name is --repeat-base's")
    return a


def main(argv=None) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    chk = Check(a)
    try:  # what `serve run` imports first: a missing package fails here in seconds
        importlib.import_module("omni_ray.ingress.app")
    except Exception as e:  # noqa: BLE001 - the run's only line then
        chk.line("FAIL", "preflight: the app's modules import", f"{type(e).__name__}: {e}")
        chk.save("FAIL gpu_check: the app cannot be imported")
        return 1
    if a.device == "cpu":
        import torch

        torch.set_num_threads(1)
    info = machine_info()
    # --commit: the machine the check ran on may hold the tree without its git history
    chk.data.update(commit=a.commit or git("rev-parse", "HEAD"),
                    dirty=False if a.commit else bool(git("status", "--short")),
                    device=a.device, gpu=info["gpu"], versions=versions(), machine=info)
    print(f"gpu_check {chk.data['commit'][:12]}{' (dirty)' if chk.data['dirty'] else ''} on "
          f"{a.device} ({info['gpu'] or info['cpu']}), phases {a.phases}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:  # the checkpoints
        chk.tmp = Path(tmp)
        for name in a.phases.split(","):
            if chk.left_s() <= 0:
                chk.line("SKIP", name, f"time budget {a.time_budget:.0f}s spent")
                continue
            try:
                PHASES[name](chk)
            except Exception as e:  # noqa: BLE001 - a crashed phase is a FAIL line; the rest runs
                chk.line("FAIL", name, f"{type(e).__name__}: {e}",
                         traceback=traceback.format_exc())
                traceback.print_exc()
    n = {s: sum(c["status"] == s for c in chk.checks) for s in ("PASS", "FAIL", "SKIP")}
    summary = (f"{'FAIL' if n['FAIL'] else 'PASS'} gpu_check: {n['PASS']} passed, {n['FAIL']} "
               f"failed, {n['SKIP']} skipped in {time.perf_counter() - chk.t0:.0f}s")
    print(summary, flush=True)
    chk.save(summary)
    return 1 if n["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
