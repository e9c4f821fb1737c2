"""Stage-to-stage hand-off: per-chunk latency and throughput, 8 KB to 32 MB payloads.

Methods (the payload is an ``AudioChunk`` whose samples take the named size):

* ``ray_push``: ours. A sender actor encodes each chunk (``encode_chunk``) and calls a receiver
  actor's async ``push``, which decodes it (``decode_chunk``), as ``transport/ray_push.py`` and
  ``stages/engine.py`` do; both actors ask for 0 CPUs like the engine actors;
* ``queue``: the floor; ``queue.Queue`` between two threads of one process, passing the chunk
  objects themselves (no codec);
* ``shm_file``: what vLLM-Omni's SharedMemoryConnector does; the writer writes one file per chunk
  under /dev/shm (encoded bytes, atomic rename), a reader process polls for it every 1 ms, reads,
  decodes, deletes;
* ``codec``: ``encode_chunk`` + ``decode_chunk`` in-process, no transport (the codec's share).

Modes: ``ack`` (send, wait for the acknowledgement, next: latency = round trip) and
``pipelined`` (at most 8 unacknowledged, as ``ChunkSender``: latency = send start -> decoded at
the receiver, one way; clocks are CLOCK_MONOTONIC, shared by processes on Linux).

    python -m benchmarks.transport_bench   # -> results/transport_cpu.json + .png, < 2 min
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from collections import deque
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_info, write_json
from benchmarks.metrics import stats

SIZES = {"8K": 8 << 10, "64K": 64 << 10, "512K": 512 << 10, "4M": 4 << 20, "32M": 32 << 20}
WINDOW = 8       # max unacknowledged chunks in pipelined mode (PipelineConfig default)
POLL_S = 0.001   # shm_file reader's polling period


def make_chunks(nbytes: int, n: int) -> list:
    """``n`` AudioChunks (seq 0..n-1) sharing one float32 tensor of ``nbytes`` bytes."""
    import torch

    from omni_ray.payload import AudioChunk

    samples = torch.randn(max(nbytes // 4, 1))
    return [AudioChunk(request_id="bench", seq=i, start_sample=i * samples.numel(),
                       samples=samples, finished=i == n - 1) for i in range(n)]


def result(method: str, mode: str, size: str, n: int, lat: list[float], wall: float,
           encoded: int | None) -> dict:
    """One row: latency stats in ms, throughput in payload MB/s."""
    nbytes = SIZES[size]
    ms = {k: v if k == "n" or v is None else v * 1e3 for k, v in stats(lat).items()}
    return dict(method=method, mode=mode, size=size, payload_bytes=nbytes, encoded_bytes=encoded,
                chunks=n, latency_ms=ms, throughput_mb_s=nbytes * n / wall / 1e6,
                chunks_per_s=n / wall, loadavg_1m=round(os.getloadavg()[0], 2))


# -- queue.Queue between two threads (the floor) --------------------------------------------------
def bench_queue(chunks: list, window: int) -> tuple[list[float], float]:
    q: queue.Queue = queue.Queue()
    acks: queue.Queue = queue.Queue()
    slots = threading.Semaphore(window)

    def consumer():
        for _ in chunks:
            _t, _chunk = q.get()
            acks.put(time.perf_counter())
            slots.release()

    th = threading.Thread(target=consumer)
    th.start()
    sent, lat = [], []
    t0 = time.perf_counter()
    for c in chunks:
        slots.acquire()
        sent.append(time.perf_counter())
        q.put((sent[-1], c))
        if window == 1:
            acks.get()
            lat.append(time.perf_counter() - sent[-1])
    th.join()
    wall = time.perf_counter() - t0
    if window > 1:
        lat = [acks.get() - s for s in sent]
    return lat, wall


# -- in-process codec only ------------------------------------------------------------------------
def bench_codec(chunks: list) -> tuple[list[float], float, int]:
    from omni_ray.payload import decode_chunk, encode_chunk

    lat, t0, size = [], time.perf_counter(), 0
    for c in chunks:
        t = time.perf_counter()
        buf = encode_chunk(c)
        decode_chunk(buf)
        lat.append(time.perf_counter() - t)
        size = buf.nbytes
    return lat, time.perf_counter() - t0, size


# -- /dev/shm file per chunk, polled --------------------------------------------------------------
def _shm_reader(cmds, acks) -> None:
    """Reader process: for each ("run", prefix, n), poll for prefix_<seq> files in order."""
    from omni_ray.payload import decode_chunk

    import numpy as np

    while True:
        cmd = cmds.get()
        if cmd is None:
            return
        _, prefix, n = cmd
        for seq in range(n):
            path = f"{prefix}_{seq}"
            deadline = time.monotonic() + 60
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise TimeoutError(path)
                time.sleep(POLL_S)
            decode_chunk(np.fromfile(path, dtype=np.uint8))
            os.unlink(path)
            acks.put(time.perf_counter())


class ShmBench:
    """One reader process for every run (its start-up, importing torch, is not measured)."""

    def __init__(self, shm_dir: str = "/dev/shm"):
        ctx = mp.get_context("spawn")
        self.cmds, self.acks = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_shm_reader, args=(self.cmds, self.acks), daemon=True)
        self.proc.start()
        self.dir = shm_dir
        self.runs = 0
        self.run(make_chunks(SIZES["8K"], 2), 1)  # warm-up: waits for the reader's imports

    def run(self, chunks: list, window: int) -> tuple[list[float], float, int]:
        from omni_ray.payload import encode_chunk

        self.runs += 1
        prefix = os.path.join(self.dir, f"omni_ray_bench_{os.getpid()}_{self.runs}")
        self.cmds.put(("run", prefix, len(chunks)))
        sent, lat, done, size = [], [], [], 0
        t0 = time.perf_counter()
        for seq, c in enumerate(chunks):
            while len(sent) - len(done) >= window:
                done.append(self.acks.get(timeout=60))
            sent.append(time.perf_counter())
            buf = encode_chunk(c)
            size = buf.nbytes
            tmp = f"{prefix}_{seq}.tmp"
            buf.tofile(tmp)
            os.rename(tmp, f"{prefix}_{seq}")
            if window == 1:
                done.append(self.acks.get(timeout=60))
                lat.append(time.perf_counter() - sent[-1])
        while len(done) < len(sent):
            done.append(self.acks.get(timeout=60))
        wall = time.perf_counter() - t0
        if window > 1:
            lat = [d - s for s, d in zip(sent, done)]
        return lat, wall, size

    def close(self) -> None:
        self.cmds.put(None)
        self.proc.join(timeout=10)


# -- Ray actors: our push -------------------------------------------------------------------------
class Receiver:
    async def push(self, buf) -> float:
        from omni_ray.payload import decode_chunk

        decode_chunk(buf)
        return time.perf_counter()


class Sender:
    def __init__(self, receiver):
        self.receiver = receiver

    async def run(self, nbytes: int, n: int, window: int) -> tuple[list[float], float, int]:
        from omni_ray.payload import encode_chunk

        chunks = make_chunks(nbytes, n)
        in_flight: deque = deque()
        lat, size = [], 0
        t0 = time.perf_counter()
        for c in chunks:
            t = time.perf_counter()
            buf = encode_chunk(c)
            size = buf.nbytes
            in_flight.append((t, self.receiver.push.remote(buf)))
            while len(in_flight) >= window:
                sent, ref = in_flight.popleft()
                done = await ref
                lat.append(time.perf_counter() - sent if window == 1 else done - sent)
        while in_flight:
            sent, ref = in_flight.popleft()
            lat.append(await ref - sent)
        return lat, time.perf_counter() - t0, size


def chunk_count(size: str, args) -> int:
    return args.large_chunks if SIZES[size] >= 32 << 20 else args.chunks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--chunks", type=int, default=50, help="chunks per measurement")
    ap.add_argument("--large-chunks", type=int, default=10, help="chunks per 32 MB measurement")
    ap.add_argument("--methods", default="queue,codec,shm_file,ray_push")
    ap.add_argument("--out", default="transport_cpu")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"] = "1"
    import torch

    torch.set_num_threads(1)
    sizes, methods = args.sizes.split(","), args.methods.split(",")
    before, rows = machine_info(), []

    def add(row):
        rows.append(row)
        lm = row["latency_ms"]
        print(f"{row['method']:9} {row['mode']:9} {row['size']:>5}: p50 {lm['p50']:9.3f} ms  "
              f"p99 {lm['p99']:9.3f} ms  {row['throughput_mb_s']:9.1f} MB/s", flush=True)

    # Every method at one size before the next size: load drift on a shared machine then hits
    # the methods alike. Each row also records the load average when it was measured.
    modes = {"ack": 1, "pipelined": WINDOW}
    shm = ShmBench() if "shm_file" in methods else None
    ray_sender = start_ray() if "ray_push" in methods else None
    try:
        for size in sizes:
            n = chunk_count(size, args)
            chunks = make_chunks(SIZES[size], n)
            for method in methods:
                for mode, w in modes.items():
                    if method == "codec" and mode != "ack":
                        continue
                    lat, wall, enc = measure(method, chunks, w, shm, ray_sender)
                    add(result(method, mode, size, n, lat, wall, enc))
    finally:
        if shm is not None:
            shm.close()
        if ray_sender is not None:
            import ray

            ray.shutdown()
    path = write_json(f"{args.out}.json", dict(
        benchmark="transport", config=vars(args), window=WINDOW, poll_s=POLL_S,
        machine=dict(start=before, end=machine_info()), results=rows))
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def measure(method: str, chunks: list, window: int, shm, ray_sender):
    """(latencies, wall seconds, encoded bytes or None) of one method at one size."""
    if method == "queue":
        return (*bench_queue(chunks, window), None)
    if method == "codec":
        return bench_codec(chunks)
    if method == "shm_file":
        return shm.run(chunks, window)
    if method == "ray_push":
        import ray

        nbytes = chunks[0].samples.numel() * 4
        return ray.get(ray_sender.run.remote(nbytes, len(chunks), window))
    raise ValueError(f"unknown method {method!r}")


def start_ray():
    """A local cluster with the sender and receiver actors (0 CPUs each, like the engines)."""
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             object_store_memory=1 << 30, log_to_driver=False)
    recv = ray.remote(Receiver).options(num_cpus=0).remote()
    send = ray.remote(Sender).options(num_cpus=0).remote(recv)
    ray.get(send.run.remote(SIZES["8K"], 4, 1))  # warm-up: workers, imports
    return send


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for i, key in enumerate(dict.fromkeys((r["method"], r["mode"]) for r in rows)):
        rs = sorted((r for r in rows if (r["method"], r["mode"]) == key),
                    key=lambda r: r["payload_bytes"])
        xs = [r["payload_bytes"] for r in rs]
        line, = ax.plot(xs, [r["latency_ms"]["p50"] for r in rs], marker="o",
                        label=f"{key[0]} {key[1]} p50")
        ax.plot(xs, [r["latency_ms"]["p99"] for r in rs], ls=":", color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("payload bytes")
    ax.set_ylabel("per-chunk latency (ms); dotted: p99")
    ax.set_title("stage-to-stage hand-off")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
