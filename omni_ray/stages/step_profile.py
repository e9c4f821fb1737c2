"""A ``torch.profiler`` capture of an engine's next steps (``GET /debug/profile``).

The step clocks (``loop_time``, the runners' ``time_spent``) say which part of a step takes long;
this says which ops, on the host and on the device, so a step that waits for the GPU shows what
the GPU was doing. The capture starts and stops between steps on the engine's step thread, over
the steps of whatever traffic is running; it ends after ``steps`` steps or, without traffic,
when the caller's wait runs out (with the steps it saw).

``waits`` lists the host calls that wait for the device (a stream or event synchronize, a
blocking copy, a pinned allocation): their host time a step is the step waiting for the GPU.
With ``stacks``, each comes with the Python frames that made it (omni_ray's and vLLM's), so a
wait in the middle of a step names the line that asked for it. Python's call tracing slows the
host several times over, and a slow host finds the device done: a capture with ``stacks`` says
where the waits are made (calls a step), one without it how long they last.
"""

from __future__ import annotations

import re
import time

import torch

TOP_OPS = 25  # ops per ranking in the summary
# host calls that block until the device has done something (CUDA runtime API names)
WAIT_OPS = frozenset({"cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
                      "cudaMemcpy", "cudaHostAlloc", "cudaMallocHost", "cudaFreeHost"})
CALLER_PACKAGES = ("omni_ray", "vllm")  # whose frames name a wait's call site
CALLER_FRAMES = 4  # of them, innermost first


class StepProfile:
    """``start``, ``on_step`` after each step and ``stop`` run on the step thread; ``summary``
    (seconds of Python over the events) runs off it, so the stage steps on meanwhile."""

    def __init__(self, stage: str, steps: int, stacks: bool = False):
        if steps < 1:
            raise ValueError("steps must be >= 1")
        self.stage, self.want, self.steps, self.stacks = stage, steps, 0, stacks
        self._prof = None
        self._t0 = self.wall_s = 0.0

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        if self.stacks:  # verbose: Python frames on every op (torch 2.11 records none without)
            from torch._C._profiler import _ExperimentalConfig

            self._prof = profile(activities=acts, with_stack=True,
                                 experimental_config=_ExperimentalConfig(verbose=True))
        else:
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
            ms_per_step=1e3 * wall / n, device=device, stacks=self.stacks,
            # every op's self time summed: the device's busy time a step against ms_per_step
            # says whether the step waits for the GPU or the GPU waits for the host
            host_ms_per_step_total=sum(o["host_ms_per_step"] for o in ops),
            device_ms_per_step_total=sum(o["device_ms_per_step"] for o in ops),
            top_host=sorted(ops, key=lambda o: -o["host_ms_per_step"])[:TOP_OPS],
            top_device=(sorted(ops, key=lambda o: -o["device_ms_per_step"])[:TOP_OPS]
                        if device else []),
            waits=(callers(self._prof.events(), WAIT_OPS, n) if self.stacks else
                   sorted((o for o in ops if o["op"] in WAIT_OPS),
                          key=lambda o: -o["host_ms_per_step"])),
            table=averages.table(sort_by=by, row_limit=TOP_OPS),
        )


def callers(events, ops, steps: int, packages=CALLER_PACKAGES) -> list[dict]:
    """Per op in ``ops`` and call site: calls and host milliseconds a step, most time first.
    The call site is the innermost Python frame, then up to ``CALLER_FRAMES`` frames of
    ``packages``, of the nearest event around it that has a stack (a CUDA runtime call has
    none; the op or Python call that made it has)."""
    sites: dict[tuple, dict] = {}
    for e in events:
        if e.name not in ops:
            continue
        up = e
        while up is not None and not up.stack:
            up = up.cpu_parent
        where = tuple(_frames(up.stack, packages)) if up is not None else ("(no Python frame)",)
        site = sites.setdefault((e.name, where), dict(op=e.name, where=list(where), calls=0,
                                                      host_us=0.0))
        site["calls"] += 1
        site["host_us"] += e.cpu_time_total
    return sorted((dict(op=s["op"], where=s["where"], calls_per_step=s["calls"] / steps,
                        host_ms_per_step=s["host_us"] / 1e3 / steps) for s in sites.values()),
                  key=lambda s: -s["host_ms_per_step"])


def _frames(stack: list[str], packages) -> list[str]:
    """The innermost frame as it is, then the first frames from ``packages`` (torch writes a
    frame's file from its ``sys.path`` entry on: "vllm/v1/worker/gpu_model_runner.py(123):
    sample_tokens"; a longer path is cut to start at the package)."""
    at_pkg = re.compile(r"(?:^|/)((?:%s)[/.].*)" % "|".join(map(re.escape, packages)))
    out = stack[:1]
    for frame in stack[1:]:
        if (m := at_pkg.search(frame)) is not None:
            out.append(m.group(1))
        if len(out) > CALLER_FRAMES:
            break
    return out
