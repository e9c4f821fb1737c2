"""``thinker_disaggregation``: config validation and the deployments the builder makes (no Ray)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_ray.builders.app import build_omni_app
from omni_ray.config.serving import OmniServingArgs


def test_defaults_and_enabled_switch():
    a = OmniServingArgs.model_validate({"thinker_disaggregation": {}})
    d = a.thinker_disaggregation
    assert a.disaggregated and d.fallback == "local_prefill"
    assert (d.timeouts.prefill_s, d.timeouts.transfer_s, d.timeouts.load_s) == (30.0, 10.0, 10.0)
    assert not OmniServingArgs.model_validate({"thinker_disaggregation": {"enabled": False}}) \
        .disaggregated
    assert not OmniServingArgs().disaggregated


@pytest.mark.parametrize("bad,field", [
    ({"prefill": {"dtype": "bfloat16"}}, "must match"),
    ({"fallback": "retry"}, "fallback"),
    ({"timeouts": {"transfer_s": 0}}, "transfer_s"),
    ({"prefill": {"deployment_config": {"replicas": 2}}}, "unknown Serve deployment option"),
    ({"surprise": 1}, "surprise"),
])
def test_invalid_config_names_the_problem(bad, field):
    with pytest.raises(ValidationError, match=field):
        OmniServingArgs.model_validate({"thinker_disaggregation": bad})


def test_vllm_backends_are_accepted_on_either_side():
    """Both sides speak the portable KV layout (runners/kv.py), so any pair of backends works."""
    for prefill, decode in (("vllm", "vllm"), ("transformers", "vllm"), ("vllm", "transformers")):
        d = OmniServingArgs.model_validate({"thinker_disaggregation": {
            "prefill": {"backend": prefill}, "decode": {"backend": decode}}}).thinker_disaggregation
        assert (d.prefill.backend, d.decode.backend) == (prefill, decode)


def _deployments(app) -> dict:
    """name -> Deployment of an Application (the ingress and what it is bound to)."""
    ingress = app._bound_deployment
    out = {ingress.name: ingress}
    for arg in [*ingress.init_args, *ingress.init_kwargs.values()]:
        d = getattr(arg, "_bound_deployment", None)
        if d is not None:
            out[d.name] = d
    return out


def test_builder_replaces_thinker_with_prefill_and_decode():
    app = build_omni_app({"thinker_disaggregation": {
        "prefill": {"deployment_config": {"num_replicas": 2}},
        "decode": {"max_num_seqs": 8, "deployment_config": {"num_replicas": 3}}}})
    deps = _deployments(app)
    assert set(deps) == {"OmniIngress", "ThinkerPrefill:qwen3-omni", "ThinkerDecode:qwen3-omni",
                         "Talker:qwen3-omni", "Code2Wav:qwen3-omni"}
    assert deps["ThinkerPrefill:qwen3-omni"].num_replicas == 2
    dec = deps["ThinkerDecode:qwen3-omni"]
    assert dec.num_replicas == 3 and dec.max_ongoing_requests == 32  # 4 x its own max_num_seqs
    ingress = deps["OmniIngress"]
    # the decode deployment plays the thinker (first argument); the prefill one is passed by name
    assert ingress.init_args[0]._bound_deployment is dec
    assert ingress.init_kwargs["thinker_prefill"]._bound_deployment.name == \
        "ThinkerPrefill:qwen3-omni"


def test_builder_without_disaggregation_is_unchanged():
    deps = _deployments(build_omni_app({"thinker_disaggregation": {"enabled": False}}))
    assert set(deps) == {"OmniIngress", "Thinker:qwen3-omni", "Talker:qwen3-omni",
                         "Code2Wav:qwen3-omni"}
