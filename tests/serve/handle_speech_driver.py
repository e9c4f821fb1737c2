"""A driver that never imports torch: joins the test's Ray cluster, asks the ingress's
DeploymentHandle for speech (``speak``) and a transcription (``transcribe``), and two invalid
requests, and prints a JSON summary of what came back.

Run as ``python handle_speech_driver.py <gcs address> <app name> <speech body json> <wav file>``
(test_handle_speech.py).
"""

import asyncio
import base64
import json
import sys


async def ask(handle, speech_body: dict, wav: bytes) -> dict:
    events = [ev async for ev in handle.options(stream=True).speak.remote(speech_body)]
    transcript = await handle.transcribe.remote({"model": speech_body["model"], "file": wav})
    errors = {}
    for name, call in (
            ("speak", lambda: _drain(handle.options(stream=True).speak.remote(
                dict(speech_body, speed=1.5)))),
            ("transcribe", lambda: handle.transcribe.remote(
                {"model": speech_body["model"], "file": b"not audio"}))):
        try:
            await call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors[name] = {"value_error": isinstance(e, ValueError), "message": str(e)[-400:]}
    return {"events": events, "transcript": transcript, "errors": errors}


async def _drain(gen) -> None:
    async for _ in gen:
        pass


def _types(obj) -> set[str]:
    """The types of every value in ``obj``, nested dicts walked."""
    out = {type(obj).__module__ + "." + type(obj).__name__}
    if isinstance(obj, dict):
        for v in obj.values():
            out |= _types(v)
    return out


def main() -> None:
    import numpy as np
    import ray
    from ray import serve

    address, app, body, wav_path = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    with open(wav_path, "rb") as f:
        wav = f.read()
    ray.init(address=address, log_to_driver=False)
    got = asyncio.run(asyncio.wait_for(ask(serve.get_app_handle(app), body, wav), 240))
    events = got["events"]
    audio = [e for e in events if e["type"] == "audio"]
    print(json.dumps({
        "kinds": [e["type"] for e in events],
        "pcm16": base64.b64encode(b"".join(e["pcm16"] for e in audio)).decode(),
        "samples_match_pcm16": all(
            isinstance(e["samples"], np.ndarray) and e["samples"].dtype == np.float32
            and e["samples"].size == e["num_samples"] == len(e["pcm16"]) // 2 for e in audio),
        "done": {k: v for k, v in events[-1].items() if k != "type"},
        "transcript": got["transcript"],
        "errors": got["errors"],
        "value_types": sorted(set().union(*(_types(e) for e in events), _types(got["transcript"]))),
        "torch_imported": "torch" in sys.modules,
    }))


if __name__ == "__main__":
    main()
