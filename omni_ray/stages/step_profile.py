"""A ``torch.profiler`` capture of an engine's next steps (``GET /debug/profile``).

The step clocks (``loop_time``, the runners' ``time_spent``) say which part of a step takes long;
this says which ops, on the host and on the device, so a step that waits for the GPU shows what
the GPU was doing. The capture starts and stops between steps on the engine's step thread, over
the steps of whatever traffic is running; it ends after ``steps`` steps or, without traffic,
when the caller's wait runs out (with the steps it saw).
"""

from __future__ import annotations

import time

import torch

TOP_OPS = 25  # ops per ranking in the summary


class StepProfile:
    """``start``, ``on_step`` after each step and ``stop`` run on the step thread; ``summary``
    (seconds of Python over the events) runs off it, so the stage steps on meanwhile."""

    def __init__(self, stage: str, steps: int):
        if steps < 1:
            raise ValueError("steps must be >= 1")
        self.stage, self.want, self.steps = stage, steps, 0
        self._prof = None
        self._t0 = self.wall_s = 0.0

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=acts)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def on_step(self) -> bool:
        """Count a step; True when the capture has all it asked for."""
        self.steps += 1
        return self.steps >= self.want

    def stop(self) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self._prof.__exit__(None, None, None)

    def summary(self) -> dict:
        """Per op, calls and milliseconds per step on the host (self time) and on the device
        (self time of its kernels), top ``TOP_OPS`` by each; and torch's table."""
        wall, n = self.wall_s, max(self.steps, 1)
        device = torch.cuda.is_available()
        averages = self._prof.key_averages()  # slow on many events: once
        ops = [dict(op=e.key, calls_per_step=e.count / n,
                    host_ms_per_step=e.self_cpu_time_total / 1e3 / n,
                    device_ms_per_step=e.self_device_time_total / 1e3 / n)
               for e in averages]
        by = "self_cuda_time_total" if device else "self_cpu_time_total"
        return dict(
            stage=self.stage, steps=self.steps, asked=self.want, wall_s=wall,
            ms_per_step=1e3 * wall / n, device=device,
            # every op's self time summed: the device's busy time a step against ms_per_step
            # says whether the step waits for the GPU or the GPU waits for the host
            host_ms_per_step_total=sum(o["host_ms_per_step"] for o in ops),
            device_ms_per_step_total=sum(o["device_ms_per_step"] for o in ops),
            top_host=sorted(ops, key=lambda o: -o["host_ms_per_step"])[:TOP_OPS],
            top_device=(sorted(ops, key=lambda o: -o["device_ms_per_step"])[:TOP_OPS]
                        if device else []),
            table=averages.table(sort_by=by, row_limit=TOP_OPS),
        )
