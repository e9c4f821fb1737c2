"""WS /v1/realtime (issue 23) over a real Serve app on the tiny checkpoint, with real clients: the
``openai`` package's realtime client and a plain ``websockets`` client streaming a spoken question
(espeak-ng) in real-time packets. Every server event seen must parse as ``openai``'s
``RealtimeServerEvent`` (realtime_helpers.Socket checks each)."""

from __future__ import annotations

import base64
import io
import time
import uuid
import wave

import numpy as np
import pytest
from openai import OpenAI
from pydantic import SecretStr
from realtime_helpers import RATE, Socket, answer_of, check, espeak_available, spoken
from serve_helpers import MODEL, app_args, busy_stages, poll, wait_ready

pytestmark = pytest.mark.slow

KEY = f"sk-rt-{uuid.uuid4().hex}"
APP = "omni-realtime"
MAX_TOKENS, FRAMES = 8, 24
PER_KEY = 3  # sockets (and requests) per key at once
IDLE_S = 4.0


@pytest.fixture(scope="module")
def url(serve_port, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    args = app_args(tiny_model_dir, "async_chunk")
    args["security"] = {"api_keys": [SecretStr(KEY)], "enable_debug_endpoints": True}
    args["limits"].update(default_max_audio_frames=FRAMES,
                          max_concurrent_requests_per_key=PER_KEY)
    args["realtime"] = {"idle_timeout_s": IDLE_S}
    serve.run(build_omni_app(args), name=APP, route_prefix="/rt")
    base = f"http://127.0.0.1:{serve_port}/rt"
    yield wait_ready(base)
    serve.delete(APP)


@pytest.fixture(scope="module")
def ws_url(url):
    return url.replace("http://", "ws://")


@pytest.fixture(scope="module")
def question():
    if not espeak_available():
        pytest.skip("espeak-ng is not installed (scripts/install.sh installs Debian's)")
    return spoken("What is the capital of France?")


def debug(url: str, path: str) -> dict:
    import httpx

    r = httpx.get(f"{url}{path}", headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def clean(url: str, deadline_s: float = 10.0) -> None:
    """No stage holds request state and the ingress no socket."""
    def ok():
        s = debug(url, "/debug/stats")
        return not busy_stages(s) and debug(url, "/debug/realtime")["sockets"] == 0
    poll(ok, deadline_s, "stages and sockets clean")


def wav_bytes(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.astype("<i2").tobytes())
    return buf.getvalue()


def chat_answer(url: str, pcm: np.ndarray) -> tuple[str, bytes]:
    """The chat API's streamed answer (text, pcm16) to the same audio question."""
    c = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    text, audio = [], []
    for ch in c.chat.completions.create(
            model=MODEL, modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
            max_tokens=MAX_TOKENS, stream=True,
            messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {
                "data": base64.b64encode(wav_bytes(pcm)).decode(), "format": "wav"}}]}]):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        text.append(d.content or "")
        a = getattr(d, "audio", None) or (d.model_extra or {}).get("audio")
        data = a.get("data") if isinstance(a, dict) else getattr(a, "data", None)
        if data:
            audio.append(base64.b64decode(data))
    return "".join(text), b"".join(audio)


def manual_session(sock: Socket, **over) -> dict:
    session = {"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": MAX_TOKENS,
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                   "turn_detection": None},
                         "output": {"format": {"type": "audio/pcm", "rate": 24000},
                                    "voice": "ethan"}}}
    session.update(over)
    sock.send({"type": "session.update", "session": session})
    return sock.until("session.updated")


# -- protocol basics ------------------------------------------------------------------------------
def test_manual_commit_answer_equals_chat(url, ws_url, question):
    """turn_detection null: append, commit, response.create; the answer (transcript and audio)
    equals the chat API's for the same audio."""
    sock = Socket(ws_url, KEY)
    try:
        created = sock.recv()
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        upd = manual_session(sock)
        assert upd["session"]["audio"]["input"]["turn_detection"] is None
        sock.stream(question, packet_ms=100, realtime=False)
        sock.send({"type": "input_audio_buffer.commit"})
        committed = sock.until("input_audio_buffer.committed")
        sock.until("conversation.item.done")
        sock.send({"type": "response.create"})
        done = sock.until("response.done")
        # random weights: the thinker usually runs to max_output_tokens ("incomplete")
        assert done["response"]["status"] in ("completed", "incomplete"), done
        rid = done["response"]["id"]
        text, pcm = answer_of([e for _, e in sock.events], rid)
        usage = done["response"]["usage"]
        assert usage["output_token_details"]["audio_tokens"] == -(-len(pcm) // 2 // 1920)
        assert usage["input_token_details"]["audio_tokens"] > 0
        order = sock.types()
        for a, b in [("response.created", "response.output_item.added"),
                     ("response.output_item.added", "response.output_audio.delta"),
                     ("response.output_audio.delta", "response.output_audio.done"),
                     ("response.output_audio_transcript.done", "response.done")]:
            assert order.index(a) < order.index(b), order
        assert committed["item_id"]
    finally:
        sock.close()
    ref_text, ref_pcm = chat_answer(url, question)
    assert text == ref_text and len(pcm) > 0
    assert pcm == ref_pcm
    clean(url)


def test_openai_client_server_vad_turn(url, question):
    """The ``openai`` package's realtime client streams the question in 40 ms packets in real
    time; server VAD finds the turn (speech_started/stopped, committed) and answers; the answer
    equals the chat API's for the committed audio (the ms the VAD events name)."""
    import asyncio
    import json

    from openai import AsyncOpenAI

    async def talk():
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        events = []
        async with client.realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={
                "type": "realtime", "output_modalities": ["audio"],
                "max_output_tokens": MAX_TOKENS,
                "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.5,
                                                       "prefix_padding_ms": 300,
                                                       "silence_duration_ms": 400}},
                          "output": {"voice": "ethan"}}})

            async def speak():
                step = RATE * 40 // 1000
                t0 = time.monotonic()
                for i, a in enumerate(range(0, question.size, step)):
                    await conn.input_audio_buffer.append(
                        audio=base64.b64encode(question[a:a + step].tobytes()).decode())
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.04 - time.monotonic()))

            sender = asyncio.create_task(speak())
            while True:
                raw = await asyncio.wait_for(conn.recv_bytes(), 120)
                ev = check(json.loads(raw))
                assert conn.parse_event(raw).type == ev["type"]
                events.append(ev)
                if ev["type"] == "response.done":
                    break
            await sender
        return events

    events = asyncio.run(talk())
    types = [e["type"] for e in events]
    for kind in ("session.created", "session.updated", "input_audio_buffer.speech_started",
                 "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                 "conversation.item.added", "conversation.item.created", "response.created",
                 "response.output_item.added",
                 "response.output_audio.delta", "response.output_audio_transcript.delta",
                 "response.done"):
        assert kind in types, (kind, types)
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    lead = int(0.4 * 1000)  # spoken(): 0.4 s of silence, then speech
    assert lead - 300 - 100 <= started["audio_start_ms"] <= lead, started
    assert stopped["audio_end_ms"] < question.size // 24, stopped
    assert started["item_id"] == stopped["item_id"]
    done = events[-1]
    text, pcm = answer_of(events, done["response"]["id"])
    turn = question[started["audio_start_ms"] * 24:stopped["audio_end_ms"] * 24]
    assert (text, pcm) == chat_answer(url, turn)
    clean(url)


def test_bad_events_answer_error_and_keep_the_socket(url, ws_url):
    sock = Socket(ws_url, KEY)
    try:
        sock.until("session.created")
        cases = [
            ({"type": "input_audio_buffer.frobnicate"}, "type", "invalid_value"),
            ({"type": "input_audio_buffer.append", "audio": "%%%not base64"}, "audio",
             "invalid_base64"),
            ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()},
             "audio", "invalid_audio"),
            ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}}}}},
             "session.audio.input.format.rate", "invalid_value"),
            ({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {
                "format": {"type": "audio/pcmu"}}}}}, "session.audio.output.format.type",
             "invalid_value"),
            ({"type": "session.update", "session": {"audio": {"output": {"voice": "nobody"}}}},
             "session.audio.output.voice", "invalid_value"),
            ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                           "content": [{"type": "input_text"}]}},
             "item.content.0.text", "missing_required_parameter"),
            ({"type": "response.cancel"}, None, "response_cancel_not_active"),
            ({"type": "input_audio_buffer.commit"}, None, "input_audio_buffer_commit_empty"),
        ]
        for event, param, code in cases:
            event["event_id"] = f"client_{uuid.uuid4().hex[:8]}"
            sock.send(event)
            err = sock.until("error")["error"]
            assert (err["param"], err["code"], err["event_id"]) == (param, code,
                                                                   event["event_id"]), err
        sock.ws.send("{not json")
        assert sock.until("error")["error"]["code"] == "invalid_json"
        # still alive and the session unchanged by the refused updates
        sock.send({"type": "session.update", "session": {"type": "realtime",
                                                         "instructions": "Be brief."}})
        s = sock.until("session.updated")["session"]
        assert s["instructions"] == "Be brief."
        assert s["audio"]["output"]["voice"] == "ethan"
        assert s["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    finally:
        sock.close()
    clean(url)


def test_barge_in_cancels_every_stage_and_the_conversation_goes_on(url, ws_url, question):
    """Speech while the answer plays: response.done (cancelled, turn_detected) and
    conversation.item.truncated at the audio sent; every stage's request count back to zero
    before the new turn ends; then the new turn is answered with the earlier turns in context."""
    speech = question[int(0.4 * RATE):]  # no leading silence: the VAD fires at once
    sock = Socket(ws_url, KEY)
    try:
        sock.until("session.created")
        sock.send({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 48,
            "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": 300}}}}})
        sock.until("session.updated")
        sock.stream(question, packet_ms=100, realtime=False)
        sock.until("response.output_audio.delta")
        first = sock.of("response.created")[0]["response"]["id"]
        t_barge = time.monotonic()
        sock.stream(speech[:RATE // 2], packet_ms=20, realtime=False)  # 0.5 s of speech
        done = sock.until("response.done")
        took = time.monotonic() - t_barge
        assert done["response"]["id"] == first
        assert done["response"]["status"] == "cancelled", done["response"]["status_details"]
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        trunc = sock.until("conversation.item.truncated")
        _, sent = answer_of([e for _, e in sock.events], first)
        assert trunc["audio_end_ms"] == len(sent) // 2 // 24
        assert done["response"]["usage"]["output_token_details"]["audio_tokens"] == \
            -(-len(sent) // 2 // 1920)
        assert took < 5, took
        # nothing left running while the user still speaks
        poll(lambda: not busy_stages(debug(url, "/debug/stats")), 5, "stages clean")
        assert debug(url, "/debug/realtime")["responses"] == 0
        sock.stream(speech[RATE // 2:], packet_ms=100, realtime=False)
        nxt = sock.until("response.done")
        assert nxt["response"]["id"] != first
        assert nxt["response"]["status"] in ("completed", "incomplete")
        # context: the second answer's prompt holds both user turns (and the cut answer)
        assert len(sock.of("input_audio_buffer.committed")) == 2
        assert debug(url, "/debug/realtime")["items"] == 4  # user, cut answer, user, answer
    finally:
        sock.close()
    clean(url)


def test_conversation_keeps_earlier_turns_text_and_audio(url, ws_url, question):
    sock = Socket(ws_url, KEY)
    try:
        sock.until("session.created")
        manual_session(sock, output_modalities=["text"])
        sock.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Hello there."}]}})
        sock.until("conversation.item.done")
        sock.send({"type": "response.create"})
        one = sock.until("response.done")["response"]
        text1, pcm1 = answer_of([e for _, e in sock.events], one["id"])
        assert pcm1 == b"" and text1 and sock.of("response.output_text.delta")
        sock.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [
                {"type": "input_audio",
                 "audio": base64.b64encode(question.tobytes()).decode()}]}})
        sock.until("conversation.item.done")
        sock.send({"type": "response.create"})
        two = sock.until("response.done")["response"]
        u1, u2 = one["usage"], two["usage"]
        assert u2["input_token_details"]["audio_tokens"] > 0
        assert u2["input_tokens"] > u1["input_tokens"] + u1["output_tokens"]
        assert debug(url, "/debug/realtime")["items"] == 4
    finally:
        sock.close()
    clean(url)


def test_disconnects_mid_answer_leave_no_state(url, ws_url, question):
    socks = []
    for i in range(3):
        sock = Socket(ws_url, KEY)
        sock.until("session.created")
        manual_session(sock)
        sock.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": f"Question {i}?"}]}})
        sock.send({"type": "response.create"})
        socks.append(sock)
    for i, sock in enumerate(socks):
        sock.until("response.created" if i == 0 else "response.output_audio.delta")
        sock.close()
    clean(url)
    assert debug(url, "/debug/realtime") == {"sockets": 0, "responses": 0, "items": 0}


def test_keys_and_per_key_socket_limit(url, ws_url):
    from websockets.exceptions import ConnectionClosed

    bad = Socket(ws_url, "sk-wrong")
    err = bad.recv()
    assert err["type"] == "error" and err["error"]["code"] == "invalid_api_key"
    with pytest.raises(ConnectionClosed):
        bad.recv(timeout=10)
    assert bad.ws.close_code == 1008
    # OpenAI's browser subprotocol carries the key too
    proto = Socket(ws_url, None, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])
    assert proto.recv()["type"] == "session.created"
    held = [proto] + [Socket(ws_url, KEY) for _ in range(PER_KEY - 1)]
    for s in held[1:]:
        assert s.recv()["type"] == "session.created"
    over = Socket(ws_url, KEY)
    err = over.recv()
    assert err["error"]["code"] == "too_many_concurrent_requests", err
    assert debug(url, "/debug/realtime")["sockets"] == PER_KEY
    held.pop().close()
    poll(lambda: debug(url, "/debug/realtime")["sockets"] == PER_KEY - 1, 10, "socket freed")
    again = Socket(ws_url, KEY)
    assert again.recv()["type"] == "session.created"
    for s in held + [again]:
        s.close()
    wrong_model = Socket(ws_url, KEY, model="gpt-4o-realtime")
    assert wrong_model.recv()["error"]["code"] == "model_not_found"
    clean(url)


def test_idle_socket_is_closed(url, ws_url):
    from websockets.exceptions import ConnectionClosed

    sock = Socket(ws_url, KEY)
    sock.until("session.created")
    t0 = time.monotonic()
    err = sock.recv(timeout=IDLE_S + 10)
    assert err["error"]["code"] == "session_idle_timeout"
    assert IDLE_S - 0.5 <= time.monotonic() - t0 <= IDLE_S + 5
    with pytest.raises(ConnectionClosed):
        sock.recv(timeout=10)
    clean(url)


def test_readme_example_runs(url, question, tmp_path, monkeypatch, capsys):
    """README's Realtime example, as written (the URL and key put in), on the spoken question."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Realtime", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'base_url="http://127.0.0.1:8000/v1", api_key="none"' in code
    code = code.replace('base_url="http://127.0.0.1:8000/v1", api_key="none"',
                        f'base_url="{url}/v1", api_key="{KEY}"')
    (tmp_path / "question.pcm").write_bytes(question.tobytes())
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip()  # the transcript was printed
    clean(url)
