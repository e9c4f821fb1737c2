"""How many aten operators a piece of code runs: a host-cost proxy measurable off the GPU.

On CUDA each operator that is not a view costs a dispatch and at least one kernel launch on the
host (~5-15 us each); an eager stage whose step runs a thousand of them is bound by its CPU, not
its GPU (the code2wav stage at c=8 on an H200: ~50 ms host, ~10 ms device a step, session 14's
``gpu_profile.json``). Counting them on CPU shows whether a change cuts that cost before a GPU
run can time it.
"""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode


# Operators that launch nothing: allocations (their dispatch costs ~2 us, not a launch).
_NO_LAUNCH = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class OpCount(TorchDispatchMode):
    """``with OpCount() as c: ...``; then ``c.total`` and ``c.by_op`` (name -> calls) count the
    operators that launch work: not views, not bare allocations."""

    def __init__(self):
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in _NO_LAUNCH:
            self.by_op[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())
