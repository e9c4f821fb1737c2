"""The ingress warms standby engines only when some stage keeps one (ingress/warmup.py)."""

from __future__ import annotations

from omni_ray.config.serving import OmniServingArgs
from omni_ray.ingress.warmup import _any_standby


def test_the_standby_warm_up_runs_only_when_a_stage_keeps_a_standby():
    on = {"engine_restart": {"standby": True}}
    assert not _any_standby(OmniServingArgs())
    assert _any_standby(OmniServingArgs(code2wav=on))
    assert _any_standby(OmniServingArgs(thinker_disaggregation={"prefill": on}))
