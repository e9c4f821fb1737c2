"""Engine starts sharing a GPU take turns (omni_ray/stages/gpu_start.py), across real Ray actor
processes; starts on different GPUs overlap. CPU-only: the lock is a file per physical GPU id,
taken for any ``cuda`` device whether or not one is present."""

from __future__ import annotations

import time

import pytest


def _start(name: str, device: str, lock_dir: str, hold_s: float, fail: bool, go_at: float):
    import os

    os.environ["OMNI_RAY_LOCK_DIR"] = lock_dir
    from omni_ray.stages.gpu_start import gpu_start_turn

    time.sleep(max(0.0, go_at - time.time()))  # every start asks for its turn at once
    t = {}
    try:
        with gpu_start_turn(device, name):
            t["enter"] = time.time()
            time.sleep(hold_s)
            t["exit"] = time.time()
            if fail:
                raise RuntimeError("engine start failed")
    except RuntimeError:
        t["failed"] = True
    return name, t


def _overlaps(spans) -> bool:
    spans = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def _run(ray, tmp_path, specs):
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on workers' path
    task = ray.remote(num_cpus=0)(_start)
    go_at = time.time() + 20  # after every worker process is up
    refs = [task.options(runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": gpus}}).remote(
        name, device, str(tmp_path), hold, fail, go_at) for name, gpus, device, hold, fail in specs]
    return dict(ray.get(refs, timeout=120))


@pytest.mark.slow
def test_starts_on_one_gpu_never_overlap(ray_cluster, tmp_path):
    """Three engines on GPU 0 (fractional GPUs: thinker, talker, code2wav), one failing: their
    load windows are disjoint, and the failed one lets the next go."""
    got = _run(ray_cluster, tmp_path, [("thinker", "0", "cuda", 1.0, False),
                                       ("talker", "0", "cuda", 1.0, True),
                                       ("code2wav", "0", "cuda:0", 1.0, False)])
    spans = [(t["enter"], t["exit"]) for t in got.values()]
    assert not _overlaps(spans), spans
    assert got["talker"].get("failed")


@pytest.mark.slow
def test_starts_on_different_gpus_overlap(ray_cluster, tmp_path):
    """Negative control: the same starts on GPUs 0 and 1 run at once (the lock is per GPU), so
    the test above would see overlap if the lock did nothing."""
    got = _run(ray_cluster, tmp_path, [("a", "0", "cuda", 2.0, False),
                                       ("b", "1", "cuda", 2.0, False)])
    assert _overlaps([(t["enter"], t["exit"]) for t in got.values()])


def test_cpu_takes_no_lock(tmp_path, monkeypatch):
    from omni_ray.stages.gpu_start import gpu_ids

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gpu_ids("cpu") == []
    assert gpu_ids("cuda") == ["3"] and gpu_ids("cuda:1") == ["5"]


def test_the_runners_warm_up_runs_after_the_start_turn(tmp_path, monkeypatch):
    """The stage engine builds its runner inside the GPU's start turn and runs the runner's own
    warm-up (the code predictor's graphs, ~100 s on a fresh GPU) after it, so the next engine's
    start overlaps that warm-up. Seen from the lock file: taken during the build, free during
    the warm-up."""
    from types import SimpleNamespace

    from filelock import FileLock, Timeout

    import omni_ray.stages.engine as engine_mod
    from omni_ray.stages.gpu_start import lock_dir

    monkeypatch.setenv("OMNI_RAY_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    seen = {}

    def lock_free(where: str) -> None:
        try:
            with FileLock(str(lock_dir() / "omni_ray_gpu0_start.lock"), timeout=0):
                seen[where] = "free"
        except Timeout:
            seen[where] = "held"

    class Runner:
        start_phases = {}

        def warm_up(self):
            lock_free("warm_up")

    def build(stage, *args, warm_up=True, **kwargs):
        assert warm_up is False  # the engine runs it itself, after the turn
        lock_free("build")
        return SimpleNamespace(runner=Runner())

    monkeypatch.setattr(engine_mod, "build_stage_logic", build)
    eng = engine_mod.StageEngine("talker", "unused", SimpleNamespace(device="cuda"), None)
    assert seen == {"build": "held", "warm_up": "free"}
    assert {"turn_wait_s", "build_s", "warm_up_s"} <= set(eng.start_phases)
