"""Multi-node run, in its own process (it starts its own Ray, so not inside the test session).

A local 3-node cluster (``ray.cluster_utils.Cluster``): a head, node A (``{"node_a": 1}``) and
node B (``{"node_b": 2}``). The thinker's engine goes to node A, the talker's and code2wav's to
node B (``engine_resources.resources``; each replica follows its engine through the stage's
STRICT_PACK placement group), so every chunk crosses nodes. On nodes A and B (only: the
head's Serve controller keeps its default) ``RAY_max_direct_call_object_size`` is lowered, so
chunks over 256 bytes travel through the object stores (plasma, node to node) instead of inline
in the call (the tiny model's chunks are 0.1-4 KB). Ray's memory monitor is off in this
throwaway cluster: on a shared machine it would kill our workers for others' memory use.
Prints one JSON line: placement, HTTP answers, offline answers.

    python tests/serve/multinode_check.py MODEL_DIR
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys

INLINE_LIMIT = 256  # bytes: larger call arguments go through the object store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage(name: str, resources: dict) -> dict:
    from omni_ray.config.serving import OmniServingArgs

    cfg = OmniServingArgs().model_dump()[name]  # keeps the stage's default sampling
    cfg["engine_resources"] = {"resources": resources}
    return cfg


def ask(url: str, text: str, voice: str, max_tokens: int, frames: int) -> dict:
    import httpx

    b = {"model": "qwen3-omni", "messages": [{"role": "user", "content": text}], "stream": True,
         "modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16"},
         "max_tokens": max_tokens, "max_audio_frames": frames}
    out, pcm = {"text": "", "error": None}, b""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=b, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if "error" in ev:
                out["error"] = ev["error"]["message"]
                continue
            for c in ev.get("choices", []):
                out["text"] += c["delta"].get("content") or ""
                a = c["delta"].get("audio") or {}
                pcm += base64.b64decode(a.get("data") or "")
    out["pcm"] = base64.b64encode(pcm).decode()
    return out


def offline(model_dir: str, prompts: list) -> list[dict]:
    from omni_ray.audio import to_pcm16
    from omni_ray.config.request import OmniRequest
    from omni_ray.offline import Omni

    omni = Omni(model_dir, mode="async_chunk")
    outs = []
    for i, (text, voice, max_tokens, frames) in enumerate(prompts):
        req = OmniRequest(request_id=f"ref{i}", prompt_token_ids=omni.prompt_ids(text),
                          speaker=voice, max_tokens=max_tokens, max_audio_frames=frames)
        o = omni.generate(req)[0]
        outs.append({"text": o.text, "pcm": base64.b64encode(to_pcm16(o.audio)).decode()})
    return outs


def main(model_dir: str) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from omni_ray import build_omni_app

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serve_helpers import app_args

    mem = 96 << 20
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, object_store_memory=mem, include_dashboard=False))
    # Raylet env vars: the workers of nodes A and B inherit them.
    small_inline = {"RAY_max_direct_call_object_size": str(INLINE_LIMIT)}
    node_a = cluster.add_node(num_cpus=1, resources={"node_a": 1}, object_store_memory=mem,
                              env_vars=small_inline)
    node_b = cluster.add_node(num_cpus=1, resources={"node_b": 2}, object_store_memory=mem,
                              env_vars=small_inline)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = app_args(model_dir, "async_chunk", thinker=stage("thinker", {"node_a": 1}),
                        talker=stage("talker", {"node_b": 1}),
                        code2wav=stage("code2wav", {"node_b": 1}))
        serve.run(build_omni_app(args), name="omni-multinode", route_prefix="/mn")
        url = f"http://127.0.0.1:{port}/mn"
        prompts = [("Hello there, how are you?", "chelsie", 16, 40),
                   ("Tell me about two nodes", "ethan", 12, 30)]
        answers = [ask(url, *p) for p in prompts]
        import httpx

        stats = httpx.get(f"{url}/debug/stats", timeout=60).json()
        result = {
            "inline_limit": INLINE_LIMIT,
            "nodes": {"head": cluster.head_node.node_id, "a": node_a.node_id, "b": node_b.node_id},
            "engines": {k: v["node_id"] for k, v in stats.items()},
            "bytes_in": {k: v["bytes_in"] for k, v in stats.items()},
            "chunks_in": {k: v["chunks_in"] for k, v in stats.items()},
            "answers": answers,
            "offline": offline(model_dir, prompts),
        }
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
