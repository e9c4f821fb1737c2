"""Checked by mypy, never run (tests/pipeline/test_types.py): every backend's runner class is
assignable to the Protocol in omni_ray/pipeline/contracts.py that the stage logic calls it as."""

from __future__ import annotations

from omni_ray.pipeline.contracts import (
    Code2WavRunnerProtocol,
    KVThinkerRunnerProtocol,
    TalkerRunnerProtocol,
    ThinkerRunnerProtocol,
)
from omni_ray.runners.transformers.code2wav import Code2WavRunner
from omni_ray.runners.transformers.talker import TalkerRunner
from omni_ray.runners.transformers.thinker import ThinkerRunner
from omni_ray.runners.vllm.talker import VllmTalkerRunner
from omni_ray.runners.vllm.thinker import VllmThinkerRunner


def thinker(runner: ThinkerRunner) -> KVThinkerRunnerProtocol:
    return runner


def vllm_thinker(runner: VllmThinkerRunner) -> KVThinkerRunnerProtocol:
    return runner


def thinker_plain(runner: ThinkerRunner | VllmThinkerRunner) -> ThinkerRunnerProtocol:
    return runner


def talker(runner: TalkerRunner | VllmTalkerRunner) -> TalkerRunnerProtocol:
    return runner


def code2wav(runner: Code2WavRunner) -> Code2WavRunnerProtocol:
    return runner
