"""Every runner backend structurally satisfies the contract the stage logic calls.

Checked on the classes, without building a model: each method the ``Protocol`` declares exists
and accepts the contract's arguments (positional ones by position, the optional ones by name);
each property or attribute exists. Importing the vLLM runners needs no vLLM.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from omni_ray.pipeline.contracts import (Code2WavRunnerProtocol, KVThinkerRunnerProtocol,
                                         TalkerRunnerProtocol, ThinkerRunnerProtocol)
from omni_ray.runners.transformers.code2wav import Code2WavRunner
from omni_ray.runners.transformers.talker import TalkerRunner
from omni_ray.runners.transformers.thinker import ThinkerRunner
from omni_ray.runners.vllm.talker import VllmTalkerRunner
from omni_ray.runners.vllm.thinker import VllmThinkerRunner

BACKENDS = [
    (ThinkerRunnerProtocol, ThinkerRunner), (ThinkerRunnerProtocol, VllmThinkerRunner),
    (KVThinkerRunnerProtocol, ThinkerRunner), (KVThinkerRunnerProtocol, VllmThinkerRunner),
    (TalkerRunnerProtocol, TalkerRunner), (TalkerRunnerProtocol, VllmTalkerRunner),
    (Code2WavRunnerProtocol, Code2WavRunner),
]


def members(proto) -> dict[str, object]:
    """The contract's members: name -> function, property or annotation (inherited too)."""
    out: dict[str, object] = {}
    for base in reversed(proto.__mro__):
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        out.update({n: a for n, a in base.__dict__.get("__annotations__", {}).items()})
        out.update({n: v for n, v in base.__dict__.items()
                    if not n.startswith("_") and (callable(v) or isinstance(v, property))})
    return out


def accepts(impl, proto_fn, static: bool) -> list[str]:
    """Calls the contract allows that ``impl`` would refuse (empty when compatible)."""
    want = list(inspect.signature(proto_fn).parameters.values())[1:]  # without self
    sig = inspect.signature(impl)
    lead = [] if static else [object()]
    pos = [p for p in want if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    every = [p for p in want if p.kind == p.POSITIONAL_OR_KEYWORD]
    calls = [((*lead, *(object() for _ in pos)), {}), ((*lead, *(object() for _ in every)), {})]
    calls += [((*lead, *(object() for _ in pos)), {p.name: object()})
              for p in want if p.default is not p.empty]
    bad = []
    for args, kwargs in calls:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            bad.append(f"{sorted(kwargs) or len(args)}: {e}")
    return bad


@pytest.mark.parametrize("proto, cls", BACKENDS,
                         ids=[f"{c.__name__}-{p.__name__}" for p, c in BACKENDS])
def test_backend_satisfies_the_contract(proto, cls):
    for name, member in members(proto).items():
        static = inspect.getattr_static(cls, name, None)
        if isinstance(member, property):
            assert isinstance(static, property), f"{cls.__name__}.{name} is not a property"
        elif callable(member):
            assert static is not None and callable(getattr(cls, name)), \
                f"{cls.__name__} has no method {name}"
            bad = accepts(getattr(cls, name), member, isinstance(static, staticmethod))
            assert not bad, f"{cls.__name__}.{name} refuses {bad}"
        else:  # a data attribute: on the class, or set by its __init__
            assert static is not None or f"self.{name} =" in inspect.getsource(cls), \
                f"{cls.__name__} has no attribute {name}"


def test_the_contracts_hold_what_the_logic_calls():
    """A guard on the contract itself: no member the stage logic does not use creeps in."""
    assert set(members(ThinkerRunnerProtocol)) == {
        "add_request", "step", "has_unfinished", "abort", "num_requests"}
    assert set(members(KVThinkerRunnerProtocol)) - set(members(ThinkerRunnerProtocol)) == {
        "prefill_only", "extract_kv", "add_prefilled_kv"}
    assert set(members(TalkerRunnerProtocol)) == {
        "num_code_groups", "check_request", "add_request", "push_text", "has_ready", "step",
        "abort", "num_requests"}
    assert set(members(Code2WavRunnerProtocol)) == {
        "dtype", "add_request", "decode_many", "finish", "abort", "num_requests"}
