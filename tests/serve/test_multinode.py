"""Multi-node: thinker on node A, talker + code2wav on node B of a local 3-node cluster, so every
chunk crosses nodes (through the object stores); the answers equal the offline pipeline's.

The cluster needs its own Ray instance, so ``multinode_check.py`` runs in a subprocess (the
session already holds a ``ray.init`` cluster) and prints its findings as one JSON line.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("multinode_check.py")


def pcm(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<i2").astype(int)


def test_stages_on_two_nodes_match_offline(tiny_model_dir):
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)  # never join the session's cluster
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), tiny_model_dir], env=env,
                          capture_output=True, text=True, timeout=540)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT "):])

    # 1) Placement: each engine reports the node it runs on.
    nodes, engines = res["nodes"], res["engines"]
    assert engines["thinker"] == nodes["a"], (engines, nodes)
    assert engines["talker"] == nodes["b"] and engines["code2wav"] == nodes["b"], (engines, nodes)

    # 2) Chunks crossed: the talker got the thinker's, code2wav the talker's; on each edge the
    #    mean chunk is over the inline limit, so some went node to node through the object store.
    for stage in ("talker", "code2wav"):
        n, size = res["chunks_in"][stage], res["bytes_in"][stage]
        assert n > 0 and size / n > res["inline_limit"], (stage, n, size)

    # 3) Same answers as the offline pipeline (text equal, audio equal within one PCM16 step).
    for got, ref in zip(res["answers"], res["offline"]):
        assert got["error"] is None, got["error"]
        assert got["text"] == ref["text"]
        a, b = pcm(got["pcm"]), pcm(ref["pcm"])
        assert a.size > 0 and a.shape == b.shape
        assert np.abs(a - b).max() <= 1
    print(f"\nmultinode: {time.monotonic() - t0:.0f}s; engines {engines}; chunks "
          f"{res['chunks_in']}, bytes {res['bytes_in']}")
