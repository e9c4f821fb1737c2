"""omni_ray.data across nodes: on a 3-node local cluster each stage runs on its own node (custom
resources in its ``engine_resources``), chunks cross nodes through the object store, and the
rows still equal ``Omni``'s (greedy, tiny checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_each_stage_on_its_own_node_gives_omnis_rows(tiny_model_dir, omni_by_mode):
    script = Path(__file__).with_name("multinode_batch.py")
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, str(script), tiny_model_dir], capture_output=True,
                          text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["nodes"] == 3
    assert res["placed"] == {"ThinkerStage": ["thinker_node"], "TalkerStage": ["talker_node"],
                             "Code2WavStage": ["code2wav_node"]}

    omni = omni_by_mode["sync"]
    for row in res["rows"]:
        assert row["error"] is None
    want = {o.request_id: o for o in omni.generate([
        omni.request([{"role": "user", "content": p}], f"m{i}", max_tokens=5, max_audio_frames=7)
        for i, p in enumerate(["Tell me about the sea.", "Hello there.", "What is a rainbow?",
                               "Sing me a song.", "Describe a forest."])])}
    for row in res["rows"]:
        w = want[row["id"]]
        assert row["text_token_ids"] == w.text_token_ids
        assert row["samples"] == w.audio.numel()
        assert row["audio_sum"] == pytest.approx(float(w.audio.double().sum()), abs=1e-6)
