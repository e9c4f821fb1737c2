"""Shared by the realtime tests: a spoken question (espeak-ng), a plain ``websockets`` client that
streams it in real-time packets, and the check that a server event parses as ``openai``'s
``RealtimeServerEvent``."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import typing

from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

RATE = 24000
# type -> the union member of that type (validating against it names the wrong field, where the
# whole union would list every member's complaint)
SERVER_EVENTS = {m.model_fields["type"].annotation.__args__[0]: TypeAdapter(m)
                 for m in typing.get_args(typing.get_args(RealtimeServerEvent)[0])}


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def spoken(text: str, lead_s: float = 0.4, tail_s: float = 1.2) -> np.ndarray:
    """``text`` spoken by espeak-ng, pcm16 mono 24 kHz, with silence before and after."""
    import soundfile as sf
    import soxr

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "q.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "170", "-w", str(path), text],
                       check=True, capture_output=True)
        x, sr = sf.read(path, dtype="float32")
    x = soxr.resample(x, sr, RATE)
    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype("<i2")
    return np.concatenate([np.zeros(int(lead_s * RATE), "<i2"), pcm,
                           np.zeros(int(tail_s * RATE), "<i2")])


def check(event: dict) -> dict:
    """``event`` (a server event as JSON) validated as ``RealtimeServerEvent``; returned as is."""
    assert event.get("type") in SERVER_EVENTS, f"not a RealtimeServerEvent type: {event}"
    SERVER_EVENTS[event["type"]].validate_python(event)
    return event


class Socket:
    """A plain ``websockets`` client: every server event kept (and validated) with its time."""

    def __init__(self, ws_url: str, key: str | None = None, model: str = "qwen3-omni",
                 subprotocols: list[str] | None = None):
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.ws = connect(f"{ws_url}/v1/realtime?model={model}", additional_headers=headers,
                          subprotocols=subprotocols, max_size=None, open_timeout=30)
        self.events: list[tuple[float, dict]] = []

    def send(self, event: dict) -> None:
        self.ws.send(json.dumps(event))

    def recv(self, timeout: float = 60) -> dict:
        ev = check(json.loads(self.ws.recv(timeout=timeout)))
        self.events.append((time.monotonic(), ev))
        return ev

    def until(self, kind: str, timeout: float = 120) -> dict:
        """Events up to and including the first of type ``kind``."""
        end = time.monotonic() + timeout
        while True:
            ev = self.recv(max(0.1, end - time.monotonic()))
            if ev["type"] == kind:
                return ev

    def stream(self, pcm: np.ndarray, packet_ms: int = 40, realtime: bool = True,
               stop_when=None) -> float:
        """Append ``pcm`` in ``packet_ms`` packets, paced in real time; returns when the last
        packet was sent. ``stop_when(self)`` is checked after each packet (events are read
        meanwhile without blocking)."""
        step = RATE * packet_ms // 1000
        t0 = time.monotonic()
        for i, a in enumerate(range(0, pcm.size, step)):
            self.send({"type": "input_audio_buffer.append",
                       "audio": base64.b64encode(pcm[a:a + step].tobytes()).decode()})
            self.drain()
            if stop_when is not None and stop_when(self):
                break
            if realtime:
                delay = t0 + (i + 1) * packet_ms / 1000 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        return time.monotonic()

    def drain(self) -> None:
        while True:
            try:
                self.recv(timeout=0)
            except TimeoutError:
                return

    def types(self) -> list[str]:
        return [ev["type"] for _, ev in self.events]

    def of(self, kind: str) -> list[dict]:
        return [ev for _, ev in self.events if ev["type"] == kind]

    def close(self) -> None:
        self.ws.close()


def answer_of(events: list[dict], response_id: str) -> tuple[str, bytes]:
    """(transcript or text, pcm16 bytes) of one response's deltas."""
    text = "".join(e["delta"] for e in events if e.get("response_id") == response_id
                   and e["type"] in ("response.output_audio_transcript.delta",
                                     "response.output_text.delta"))
    pcm = b"".join(base64.b64decode(e["delta"]) for e in events
                   if e.get("response_id") == response_id
                   and e["type"] == "response.output_audio.delta")
    return text, pcm
