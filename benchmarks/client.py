"""One streamed chat completion over HTTP (async httpx), recorded as a ``RequestRecord``.

The SSE body is parsed line by line here (``metrics.parse_sse_line``), not by the openai client,
so that the time of every text delta and audio packet is the time its line arrived.
"""

from __future__ import annotations

import time

import httpx

from benchmarks.metrics import RequestRecord, parse_sse_line


def chat_body(prompt: str, *, model: str, max_tokens: int, max_audio_frames: int | None,
              modalities: list[str], voice: str = "ethan", audio_input: bytes | None = None,
              ignore_eos: bool = False) -> dict:
    """A streaming ``/v1/chat/completions`` body asking for usage in the last chunk;
    ``audio_input`` (wav bytes) goes before the text as an ``input_audio`` part;
    ``ignore_eos``: the answer runs to ``max_tokens`` and its audio to ``max_audio_frames``."""
    content: str | list = prompt
    if audio_input is not None:
        import base64

        content = [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(audio_input).decode(), "format": "wav"}},
            {"type": "text", "text": prompt}]
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "modalities": list(modalities), "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    if "audio" in modalities:
        body["audio"] = {"voice": voice, "format": "pcm16"}
        if max_audio_frames:
            body["max_audio_frames"] = max_audio_frames
    return body


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict) -> RequestRecord:
    """POST ``body`` to ``url``/v1/chat/completions and record the stream; never raises for
    HTTP or stream errors (they land in ``record.error``)."""
    rec = RequestRecord(start=time.perf_counter())
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return rec
            async for line in resp.aiter_lines():
                event = parse_sse_line(line)
                if event is not None:
                    rec.on_event(event, time.perf_counter())
        if rec.end is None and rec.error is None:
            rec.error = "stream ended without data: [DONE]"
    except (httpx.HTTPError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    return rec


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model id the server lists at ``/v1/models``."""
    resp = await client.get(f"{url}/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def make_client(concurrency: int, timeout_s: float = 600.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max(concurrency, 1) + 4,
                          max_keepalive_connections=max(concurrency, 1) + 4)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), limits=limits)


def spoken_question(seconds: float, rate: int = 16000) -> bytes:
    """A deterministic ``seconds``-long PCM16 wav (a warbling tone): the benchmarks' speech in."""
    import io
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 220 * t * (1 + 0.1 * np.sin(2 * np.pi * 2 * t)))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return buf.getvalue()
