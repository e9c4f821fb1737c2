"""A driver that never imports torch: joins the test's Ray cluster, streams one spoken answer
through the ingress's DeploymentHandle and prints a JSON summary of what came back.

Run as ``python handle_driver.py <gcs address> <app name> <body json>`` (test_handle_no_torch).
"""

import asyncio
import json
import sys


async def collect(handle, body: dict) -> list[dict]:
    events = []
    async for ev in handle.options(stream=True).generate.remote(body):
        events.append(ev)
    return events


def main() -> None:
    import numpy as np
    import ray
    from ray import serve

    address, app, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    ray.init(address=address, log_to_driver=False)
    events = asyncio.run(asyncio.wait_for(collect(serve.get_app_handle(app), body), 120))
    audio = [e for e in events if e["type"] == "audio"]
    print(json.dumps({
        "kinds": [e["type"] for e in events],
        "text": "".join(e["delta"] for e in events if e["type"] == "text"),
        "done_text": events[-1].get("text"),
        "num_samples": sum(e["num_samples"] for e in audio),
        "samples_numpy_f32": all(isinstance(e["samples"], np.ndarray)
                                 and e["samples"].dtype == np.float32 for e in audio),
        "pcm16_bytes": all(isinstance(e["pcm16"], bytes)
                           and len(e["pcm16"]) == 2 * e["num_samples"] for e in audio),
        "value_types": sorted({type(v).__module__ + "." + type(v).__name__
                               for e in events for v in e.values()}),
        "torch_imported": "torch" in sys.modules,
    }))


if __name__ == "__main__":
    main()
