"""Many streams' chunks into one engine: what the pushes cost the receiver's step thread.

At concurrency 32 the thinker pushed ~550 text chunks a second into the talker engine (session
19, H100: 6924 chunks in 12.5 s), one actor call each. An engine's step runs on one thread of
its actor process; every call it receives also runs Python there (argument decoding, the
asyncio task), under the GIL that thread needs. This measures that on real Ray actors and the
real ``ChunkSender`` / ``PushBatcher`` (transport/ray_push.py):

* a receiver actor with ``push`` / ``push_many`` as the engine's (``decode_chunk``, a command
  queue), and a thread doing fixed work in a loop, the stand-in of the step thread: pure
  Python (``--step-work python``, the worst case) or Python between small torch operators,
  which let the GIL go (``torch``, closer to a step's host code);
* a sender actor with one ``ChunkSender`` a stream that, every ``--step-ms``, sends each stream
  one chunk of a few tokens (an engine's step, each request's new text), with and without the
  batcher (``pipeline.coalesce_pushes``).

Per scenario: the chunks a second delivered against those offered (``streams`` x 1000 /
``step_ms``): a call waits for the GIL the busy thread holds (up to ``sys.getswitchinterval()``,
5 ms), and a request's sender waits when 8 of its pushes are unanswered; actor calls and CPU
per chunk on both sides (the receiver's beyond its busy thread's); the busy thread's work rate
against the receiver idle (1.0: no slowdown).

    python -m benchmarks.push_fanin_bench   # -> results/push_fanin_cpu.json, ~30 s
    python -m benchmarks.push_fanin_bench --step-work torch --out push_fanin_torch_cpu
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import threading
import time

from pathlib import Path

from benchmarks.machine import RESULTS_DIR, machine_info, write_json


class Receiver:
    """The engine's data plane (``push``, ``push_many``) beside a busy step thread."""

    def __init__(self, step_work: str = "python"):
        self.calls = self.chunks = 0
        self.cmds: queue.SimpleQueue = queue.SimpleQueue()
        self.work = 0
        self._stop = threading.Event()
        threading.Thread(target=self._spin, args=(step_work,), daemon=True).start()

    def _spin(self, step_work: str) -> None:
        import torch

        x = torch.zeros(64)
        while not self._stop.is_set():
            if step_work == "python":
                sum(i * i for i in range(500))  # pure Python: holds the GIL while it runs
            else:  # a step's mix: Python between torch operators (each lets the GIL go)
                for _ in range(20):
                    sum(i * i for i in range(25))
                    x = x + 1
            self.work += 1
            while True:  # the engine applies the chunks between its steps
                try:
                    self.cmds.get_nowait()
                except queue.Empty:
                    break

    def _accept(self, buf) -> bool:
        from omni_ray.payload import decode_chunk

        self.cmds.put(decode_chunk(buf))
        self.chunks += 1
        return True

    async def push(self, buf) -> bool:
        self.calls += 1
        return self._accept(buf)

    async def push_many(self, bufs) -> list[bool]:
        self.calls += 1
        return [self._accept(b) for b in bufs]

    def sample(self) -> dict:
        return dict(cpu_s=time.process_time(), work=self.work, calls=self.calls,
                    chunks=self.chunks, t=time.monotonic())


class Sender:
    async def run(self, receiver, streams: int, steps: int, step_ms: float,
                  coalesce: bool) -> dict:
        from omni_ray.payload import ThinkerChunk
        from omni_ray.transport.ray_push import ChunkSender, PushBatcher

        batcher = PushBatcher() if coalesce else None
        senders = [ChunkSender(receiver, 8, batcher=batcher) for _ in range(streams)]
        cpu0, t0 = time.process_time(), time.monotonic()
        for step in range(steps):
            for i, s in enumerate(senders):
                s.send(ThinkerChunk(request_id=f"r{i}", seq=step, token_ids=[11, 12, 13]))
            await asyncio.sleep(step_ms / 1e3)
        for s in senders:
            s.close()
        await asyncio.gather(*(s.wait() for s in senders))
        return dict(cpu_s=time.process_time() - cpu0, wall_s=time.monotonic() - t0)


def _diff(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100, help="sender steps a scenario")
    ap.add_argument("--step-ms", type=float, default=20.0,
                    help="time between the sender's steps (pipeline.text_chunk_ms: 20)")
    ap.add_argument("--step-work", choices=("python", "torch"), default="python",
                    help="the receiver's busy thread: pure Python (never lets the GIL go but "
                         "at the switch interval), or Python between small torch operators "
                         "(which release it), as a step's host code does")
    ap.add_argument("--out", default="push_fanin_cpu")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)

    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    receiver = ray.remote(num_cpus=0, max_concurrency=1000)(Receiver).remote(a.step_work)
    sender = ray.remote(num_cpus=0, max_concurrency=10)(Sender).remote()
    ray.get(sender.run.remote(receiver, 4, 10, 1.0, False))  # both started and warm

    idle_s = a.steps * a.step_ms / 1e3
    s0 = ray.get(receiver.sample.remote())
    time.sleep(idle_s)
    idle = _diff(s0, ray.get(receiver.sample.remote()))
    idle_rate, idle_cpu = idle["work"] / idle["t"], idle["cpu_s"] / idle["t"]
    rows = {"idle": dict(work_rate=1.0, receiver_cpu_s=idle["cpu_s"], seconds=idle["t"])}
    offered = a.streams * 1e3 / a.step_ms
    for name, coalesce in (("one_call_a_chunk", False), ("coalesced", True)):
        s0 = ray.get(receiver.sample.remote())
        sent = ray.get(sender.run.remote(receiver, a.streams, a.steps, a.step_ms, coalesce))
        d = _diff(s0, ray.get(receiver.sample.remote()))
        rows[name] = dict(
            chunks=d["chunks"], calls=d["calls"], chunks_per_call=d["chunks"] / d["calls"],
            chunks_per_s=d["chunks"] / d["t"], offered_chunks_per_s=offered,
            receiver_cpu_us_per_chunk=1e6 * (d["cpu_s"] - idle_cpu * d["t"]) / d["chunks"],
            sender_cpu_us_per_chunk=1e6 * sent["cpu_s"] / d["chunks"],
            # the step thread's work per second, against the receiver idle
            work_rate=d["work"] / d["t"] / idle_rate,
            sender_wall_s=sent["wall_s"], seconds=d["t"])
        print(f"{name}: {d['chunks']} chunks in {d['calls']} calls, "
              f"{rows[name]['chunks_per_s']:.0f} chunks/s of {offered:.0f} offered, receiver "
              f"{rows[name]['receiver_cpu_us_per_chunk']:.0f} us/chunk, sender "
              f"{rows[name]['sender_cpu_us_per_chunk']:.0f} us/chunk, step thread at "
              f"{rows[name]['work_rate']:.2f} of idle")
    ray.shutdown()
    path = write_json(f"{a.out}.json", dict(machine=machine_info(), step_work=a.step_work,
                                            streams=a.streams, steps=a.steps,
                                  step_ms=a.step_ms, scenarios=rows), a.out_dir)
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
