"""The realtime session without Ray (ingress/realtime/: protocol, vad, session): turn detection on
spoken audio, barge-in closing the answer's stream, beta event names, and every event sent
parsing as ``openai``'s ``RealtimeServerEvent``. Over real Serve: tests/serve/test_realtime.py."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import typing

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from omni_ray.config.serving import RealtimeConfig
from omni_ray.ingress.realtime import protocol as P
from omni_ray.ingress.realtime.session import RealtimeSession
from omni_ray.ingress.realtime.vad import TurnDetector

RATE = 24000
EVENTS = {m.model_fields["type"].annotation.__args__[0]: TypeAdapter(m)
          for m in typing.get_args(typing.get_args(RealtimeServerEvent)[0])}


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """'Hello, how are you today?' by espeak-ng at 24 kHz: 0.5 s silence, speech, 1 s silence."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/install.sh installs Debian's)")
    import soundfile as sf
    import soxr

    path = tmp_path_factory.mktemp("rt") / "q.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Hello, how are you today?"], check=True)
    x, sr = sf.read(path, dtype="float32")
    pcm = np.round(soxr.resample(x, sr, RATE) * 32767).astype("<i2")
    return np.concatenate([np.zeros(RATE // 2, "<i2"), pcm, np.zeros(RATE, "<i2")])


def turns(pcm: np.ndarray, packet: int) -> list:
    det = TurnDetector(0.5, 300, 500)
    out = []
    for a in range(0, pcm.size, packet):
        out += det.push(pcm[a:a + packet].tobytes())
    return out


def test_vad_finds_one_turn_whatever_the_packet_size(speech):
    voiced = np.flatnonzero(np.abs(speech) > 300)
    first_ms, last_ms = voiced[0] * 1000 // RATE, voiced[-1] * 1000 // RATE
    ref = turns(speech, RATE * 20 // 1000)
    assert [t.kind for t in ref] == ["started", "stopped"], ref
    assert first_ms - 300 - 120 <= ref[0].ms <= first_ms, (ref, first_ms)
    assert last_ms + 500 - 60 <= ref[1].ms <= last_ms + 500 + 200, (ref, last_ms)
    for packet_ms in (30, 100, 7):
        assert turns(speech, RATE * packet_ms // 1000) == ref
    assert turns(np.zeros(RATE * 2, "<i2"), 960) == []


class EndlessBackend:
    """Answers with text and audio until cancelled; counts open streams."""

    model_id, default_voice = "qwen3-omni", "ethan"

    def __init__(self):
        self.open = 0

    def check_voice(self, voice):
        if voice not in ("ethan", "chelsie"):
            raise ValueError(f"unknown voice {voice!r}")

    async def respond(self, messages, voice, modalities, max_tokens):
        self.open += 1
        try:
            while True:
                await asyncio.sleep(0.01)
                yield {"type": "text", "delta": "la "}
                yield {"type": "audio", "num_samples": 1920, "pcm16": b"\0\0" * 1920}
        finally:
            self.open -= 1


async def _session(backend):
    sent: list[dict] = []

    async def send(ev):
        EVENTS[ev["type"]].validate_python(ev)
        sent.append(ev)

    s = RealtimeSession(backend, send, RealtimeConfig(silence_duration_ms=300))
    await s.start()
    return s, sent


def test_barge_in_closes_the_answer_stream(speech):
    async def main():
        backend = EndlessBackend()
        s, sent = await _session(backend)
        await s.handle(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text",
                                                             "text": "Hi"}]}}))
        await s.handle(json.dumps({"type": "response.create"}))
        await asyncio.sleep(0.1)
        assert backend.open == 1
        for a in range(0, speech.size, 960):
            await s.handle(json.dumps({"type": "input_audio_buffer.append", "audio":
                                       base64.b64encode(speech[a:a + 960].tobytes()).decode()}))
            if any(e["type"] == "input_audio_buffer.speech_started" for e in sent):
                break
        types = [e["type"] for e in sent]
        done = next(e for e in sent if e["type"] == "response.done")
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        trunc = next(e for e in sent if e["type"] == "conversation.item.truncated")
        audio = sum(len(base64.b64decode(e["delta"])) for e in sent
                    if e["type"] == "response.output_audio.delta")
        assert trunc["audio_end_ms"] == audio // 2 // 24 > 0
        assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
        assert backend.open == 0 and s.response is None
        await s.close()
        assert s.items == [] and backend.open == 0
    asyncio.run(main())


def test_beta_session_fields_map_to_ga():
    ga = P.beta_session({"modalities": ["text", "audio"], "voice": "chelsie",
                         "input_audio_format": "pcm16", "turn_detection": None,
                         "max_response_output_tokens": 12})
    s = P.Session.model_validate(ga)
    assert s.output_modalities == ["audio"] and s.audio.output.voice == "chelsie"
    assert s.audio.input.turn_detection is None and s.max_output_tokens == 12

    async def main():
        s, sent = await _session(EndlessBackend())
        await s.handle(json.dumps({"type": "session.update", "session": {
            "modalities": ["text"], "turn_detection": None}}))
        assert sent[-1]["type"] == "session.updated"
        assert sent[-1]["session"]["output_modalities"] == ["text"]
        assert s.detector is None
        await s.handle(json.dumps({"type": "session.update", "session": {"voice": "nobody"}}))
        assert sent[-1]["error"]["param"] == "session.audio.output.voice"
        await s.close()
    asyncio.run(main())


def test_beta_clients_get_beta_event_names():
    """With ``OpenAI-Beta: realtime=v1`` the deltas go out as ``response.audio.delta`` etc."""
    async def main():
        sent: list[dict] = []

        async def send(ev):
            sent.append(ev)

        backend = EndlessBackend()
        s = RealtimeSession(backend, send, RealtimeConfig(), beta=True)
        await s.start()
        await s.handle(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text",
                                                             "text": "Hi"}]}}))
        await s.handle(json.dumps({"type": "response.create"}))
        await asyncio.sleep(0.1)
        await s.handle(json.dumps({"type": "response.cancel"}))
        types = {e["type"] for e in sent}
        assert {"response.audio.delta", "response.audio_transcript.delta",
                "conversation.item.created", "response.done"} <= types, types
        assert not {"response.output_audio.delta", "conversation.item.added",
                    "conversation.item.done"} & types
        created = [e for e in sent if e["type"] == "conversation.item.created"]
        assert len({e["item"]["id"] for e in created}) == len(created)  # one per item
        assert next(e for e in sent if e["type"] == "response.done")["response"][
            "status"] == "cancelled"
        await s.close()
        assert backend.open == 0
    asyncio.run(main())


def test_a_detector_made_mid_socket_counts_from_the_socket_start(speech):
    """Turn detection switched on after 2 s of audio names ms from the socket's first sample."""
    async def main():
        s, sent = await _session(EndlessBackend())
        await s.handle(json.dumps({"type": "session.update", "session": {"type": "realtime",
                       "audio": {"input": {"turn_detection": None}}}}))
        silence = np.zeros(2 * RATE, "<i2").tobytes()
        await s.handle(json.dumps({"type": "input_audio_buffer.append",
                                   "audio": base64.b64encode(silence).decode()}))
        await s.handle(json.dumps({"type": "session.update", "session": {"type": "realtime",
                       "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}))
        await s.handle(json.dumps({"type": "input_audio_buffer.append",
                                   "audio": base64.b64encode(speech.tobytes()).decode()}))
        started = next(e for e in sent if e["type"] == "input_audio_buffer.speech_started")
        assert 2000 + 500 - 300 - 120 <= started["audio_start_ms"] <= 2000 + 500, started
        await s.close()
    asyncio.run(main())


class ShortContextBackend(EndlessBackend):
    """Refuses conversations of more than two messages as the chat API does (400 on messages)."""

    async def respond(self, messages, voice, modalities, max_tokens):
        if len(messages) > 2:
            raise P.ProtocolError("messages: prompt over limits.max_prompt_tokens", "messages",
                                  "context_length_exceeded")
        yield {"type": "text", "delta": f"{len(messages)} "}
        yield {"type": "done", "finish_reason": "stop", "usage": None}


def test_a_conversation_past_the_limits_drops_its_oldest_items():
    async def main():
        s, sent = await _session(ShortContextBackend())
        for text in ("one", "two", "three"):
            await s.handle(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text",
                                                                 "text": text}]}}))
        await s.handle(json.dumps({"type": "response.create"}))
        await s.response.task
        done = [e for e in sent if e["type"] == "response.done"][-1]["response"]
        assert done["status"] == "completed", done
        assert [i.text for i in s.items] == ["two", "three", "2 "]
        await s.close()
    asyncio.run(main())
