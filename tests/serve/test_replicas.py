"""A stage with several replicas (the 1:2:2 layout of serve_configs/qwen3_omni.yaml, or two
talkers sharing one GPU under MPS): each request's chunks stay on the engines the ingress
attached for it, so concurrent answers through two talker and two code2wav replicas equal the
offline pipeline's, request by request, and both replicas of each stage hold an engine."""

from __future__ import annotations

import concurrent.futures as cf
import time

import numpy as np
import pytest
from chat_helpers import ask, offline_answer
from serve_helpers import app_args, wait_ready

from benchmarks import step_profile

pytestmark = pytest.mark.slow
SAMPLES = 30  # stats fetches: Serve routes each to one replica, so both are seen (p ~ 1 - 2^-29)

PROMPTS = ["Hello there, how are you?", "Name three colours.", "Count to five.",
           "What is the weather like?", "Tell me a joke.", "Say goodbye."]


@pytest.fixture(scope="module")
def replicas_url(serve_base_url, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    # 3 calls at most on a replica: six concurrent requests cannot all land on one (Serve's
    # power-of-two routing put all six on one code2wav replica in one CI run of many)
    two = {"deployment_config": {"num_replicas": 2, "max_ongoing_requests": len(PROMPTS) // 2}}
    serve.run(build_omni_app(app_args(tiny_model_dir, "async_chunk", talker=two, code2wav=two)),
              name="omni-replicas", route_prefix="/replicas")
    yield wait_ready(f"{serve_base_url}/replicas")
    serve.delete("omni-replicas")


def test_two_talkers_and_two_vocoders_answer_as_offline(replicas_url, offline):
    from ray import serve

    deployments = serve.status().applications["omni-replicas"].deployments
    running = {name.split(":")[0]: d.replica_states.get("RUNNING", 0)
               for name, d in deployments.items()}
    assert running == {"Thinker": 1, "Talker": 2, "Code2Wav": 2, "OmniIngress": 1}, running
    before = step_profile.fetch(replicas_url, samples=SAMPLES)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:  # all at once: each replica takes three
        got = list(pool.map(lambda p: ask(replicas_url, text=p, stream=True), PROMPTS))
    prof = step_profile.diff(before, step_profile.fetch(replicas_url, samples=SAMPLES),
                             time.perf_counter() - t0)
    # the bench's step profile sums both engines of a stage, and says how the work split
    assert {s: r["replicas"] for s, r in prof.items()} == {"thinker": 1, "talker": 2,
                                                          "code2wav": 2}, prof
    for stage in ("talker", "code2wav"):
        row = prof[stage]
        assert len(row["rows_by_replica"]) == 2 and min(row["rows_by_replica"]) > 0, row
        assert sum(row["rows_by_replica"]) == pytest.approx(
            row["requests_per_step"] * row["steps"]), row
    for prompt, (text, pcm, finish, _) in zip(PROMPTS, got):
        ref_text, ref_pcm = offline_answer(offline["async_chunk"], text=prompt)
        assert text == ref_text, prompt
        assert pcm is not None and pcm.shape == ref_pcm.shape, prompt
        assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1, prompt
        assert finish in ("stop", "length")
