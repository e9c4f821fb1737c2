"""Run by test_multinode_batch.py in its own process: a 3-node local cluster
(``ray.cluster_utils.Cluster``), each stage's actors pinned to their own node by a custom
resource; prints one JSON line: where each stage's actors ran, and the rows."""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster

from omni_ray.config.serving import EngineResources, StageConfig
from omni_ray.data import DataStageConfig, OmniProcessorConfig, build_omni_processor

model = sys.argv[1]
cluster = Cluster(initialize_head=True, head_node_args=dict(
    num_cpus=1, resources={"thinker_node": 1}, object_store_memory=128 << 20))
for name in ("talker_node", "code2wav_node"):
    cluster.add_node(num_cpus=1, resources={name: 1}, object_store_memory=128 << 20)
ray.init(address=cluster.address, log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False


def stage(node: str) -> DataStageConfig:
    return DataStageConfig(batch_size=3, engine=StageConfig(
        engine_resources=EngineResources(resources={node: 1})))


cfg = OmniProcessorConfig(model=model, default_max_tokens=5, default_max_audio_frames=7,
                          audio_format="float32", thinker=stage("thinker_node"),
                          talker=stage("talker_node"), code2wav=stage("code2wav_node"))
rows = [{"id": f"m{i}", "prompt": p} for i, p in enumerate(
    ["Tell me about the sea.", "Hello there.", "What is a rainbow?", "Sing me a song.",
     "Describe a forest."])]
out = build_omni_processor(cfg)(ray.data.from_items(rows)).take_all()
from ray._private.state import actors  # noqa: E402 - the GCS's table (no dashboard here)

nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes()}
placed = {}
for a in actors().values():
    for s in ("ThinkerStage", "TalkerStage", "Code2WavStage"):
        if s in (a.get("ActorClassName") or ""):
            res = nodes.get(a["Address"]["NodeID"], {})
            placed.setdefault(s, set()).add(next((k for k in res if k.endswith("_node")), "?"))
print(json.dumps(dict(placed={k: sorted(v) for k, v in placed.items()}, nodes=len(nodes), rows=[
    dict(id=r["id"], error=r["error"], text_token_ids=list(r["text_token_ids"]),
         samples=len(r["audio"]), audio_sum=float(sum(r["audio"]))) for r in out])))
ray.shutdown()
cluster.shutdown()
