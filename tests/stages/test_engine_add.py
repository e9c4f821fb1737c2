"""``StageEngine.add_request`` while the step thread is busy (real engine actors on the tiny
checkpoint, in the session's Ray cluster).

The talker's and code2wav's ``check`` tells every refusal, so their add is queued for the step
thread and the call returns at once: opening a request does not wait for the step in progress.
The thinker's runner alone can refuse a prompt, so its add still waits. Bad input is refused at
once either way, and an add that fails later on the step thread ends the request's stream with
the error. Both engines report where their start went (``start_phases``)."""

from __future__ import annotations

import sys
import time

import pytest
import ray
from ray import cloudpickle

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import DOWNSTREAM_LATER, OmniRequest
from omni_ray.config.serving import StageConfig
from omni_ray.stages.engine import StageEngine

HOLD_S = 3.0
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/


class _Holdable(StageEngine):
    """A real engine, plus test hooks on its step thread."""

    async def hold_loop(self, seconds: float) -> None:
        """The step thread runs one command that takes ``seconds`` (as a long step would)."""
        self._ensure_thread()
        self._post(lambda: time.sleep(seconds))

    async def fail_next_add(self) -> None:
        """The stage logic's next ``add`` raises on the step thread."""
        real = self.logic.add

        def add(req, has_downstream):
            self.logic.add = real
            raise RuntimeError("injected add failure")

        self.logic.add = add


@pytest.fixture(scope="module")
def engines(ray_cluster, tiny_model_dir):
    made = {stage: ray.remote(_Holdable).options(num_cpus=0).remote(
        stage, tiny_model_dir, StageConfig(), PipelineConfig()) for stage in ("thinker", "talker")}
    ray.get([e.ready.remote() for e in made.values()])
    yield made
    for e in made.values():
        ray.kill(e)


def _req(rid: str, **kw) -> OmniRequest:
    return OmniRequest(request_id=rid, prompt_token_ids=[1, 2, 3], max_tokens=4, **kw)


def _timed_add(engine, req, downstream) -> float:
    ray.get(engine.hold_loop.remote(HOLD_S))
    t0 = time.perf_counter()
    ray.get(engine.add_request.remote(req, downstream))
    return time.perf_counter() - t0


def test_talker_add_does_not_wait_for_the_step_thread(engines):
    talker = engines["talker"]
    took = _timed_add(talker, _req("t-open"), DOWNSTREAM_LATER)
    assert took < HOLD_S / 3, took
    time.sleep(HOLD_S)  # the add was applied after the held command, before anything later
    stats = ray.get(talker.stats.remote())
    assert stats["requests"] == 1 and stats["runner_requests"] == 1
    assert ray.get(talker.abort.remote("t-open"))
    assert ray.get(talker.stats.remote())["runner_requests"] == 0


def test_thinker_add_still_waits_for_its_runner(engines):
    thinker = engines["thinker"]
    took = _timed_add(thinker, _req("k-open", modalities=("text",)), None)
    assert took >= HOLD_S * 0.9, took
    assert ray.get(thinker.abort.remote("k-open"))


def test_bad_input_is_refused_at_once_and_nothing_is_kept(engines):
    talker = engines["talker"]
    ray.get(talker.hold_loop.remote(HOLD_S))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="unknown speaker 'nobody'"):
        ray.get(talker.add_request.remote(_req("t-bad", speaker="nobody"), DOWNSTREAM_LATER))
    with pytest.raises(ValueError, match="downstream"):
        ray.get(talker.add_request.remote(_req("t-bad"), None))
    assert time.perf_counter() - t0 < HOLD_S / 3
    assert ray.get(talker.stats.remote())["requests"] == 0


def test_an_add_that_fails_on_the_step_thread_ends_the_stream_with_its_error(engines):
    talker = engines["talker"]
    ray.get(talker.fail_next_add.remote())
    ray.get(talker.add_request.remote(_req("t-fail"), DOWNSTREAM_LATER))
    with pytest.raises(ray.exceptions.RayTaskError, match="add failed: RuntimeError: injected"):
        for ref in talker.stream.options(num_returns="streaming").remote("t-fail"):
            ray.get(ref)
    stats = ray.get(talker.stats.remote())
    assert stats["requests"] == 0 and stats["runner_requests"] == 0 and stats["errors"] >= 1


def test_engines_report_where_their_start_went(engines):
    thinker, talker = (ray.get(engines[s].stats.remote())["start_phases"]
                       for s in ("thinker", "talker"))
    for phases in (thinker, talker):
        assert phases["build_s"] > 0 and phases["turn_wait_s"] >= 0, phases
    # the talker's runner times its own parts (runners/start_phases.py); its code predictor's
    # warm-up runs after the build, out of the GPU start turn (stages/gpu_start.py)
    assert 0 <= talker["code_predictor_warmup_s"] <= talker["warm_up_s"], talker
