"""A client leaving in the middle of a streamed ``response_format: pcm`` speech answer
(``POST /v1/audio/speech``) leaves no request state: every stage aborts the request (their
``aborts`` counters rise, so the client really left mid-answer) and every table of every stage
(engine requests, runner requests, unacknowledged pushes, held chunks) is empty within 10 s;
the app still answers afterwards."""

from __future__ import annotations

import json
import socket
import struct
import time
from urllib.parse import urlsplit

import httpx
import pytest
from serve_helpers import MODEL, busy_stages, stats, wait_clean

pytestmark = pytest.mark.slow

TEXT = ("This answer is long on purpose, so that the client can leave while the talker is still "
        "speaking it, many seconds before its end.")
FRAMES = 400  # 32 s of audio: far longer than the client stays


def _body(**over) -> dict:
    return {"model": MODEL, "input": TEXT, "voice": "ethan", "response_format": "pcm",
            "max_audio_frames": FRAMES, **over}


def _leave_after(url: str, pieces: int) -> int:
    """Stream the pcm answer, close the connection after ``pieces`` chunks; bytes read."""
    got = 0
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=_body(), timeout=180) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("audio/pcm")
        for i, chunk in enumerate(r.iter_raw(), 1):
            got += len(chunk)
            if i >= pieces:
                break
    return got


def _reset_after_headers(url: str) -> None:
    """Raw socket: wait for the response headers, then close with a reset (RST)."""
    u = urlsplit(url)
    data = json.dumps(_body()).encode()
    head = (f"POST {u.path}/v1/audio/speech HTTP/1.1\r\nHost: {u.hostname}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    s = socket.create_connection((u.hostname, u.port), timeout=120)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(head + data)
        assert s.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        s.close()


@pytest.mark.parametrize("leave", ["first_piece", "third_piece", "reset_after_headers"])
def test_leaving_a_pcm_speech_stream_leaves_no_state(serve_urls, leave):
    url = serve_urls["async_chunk"]
    assert wait_clean(url, 30) == {}
    before = stats(url)
    t0 = time.monotonic()
    if leave == "reset_after_headers":
        _reset_after_headers(url)
    else:
        got = _leave_after(url, 1 if leave == "first_piece" else 3)
        assert 0 < got < (FRAMES * 1920 - 555) * 2  # left mid-answer
    busy = wait_clean(url, 10)
    assert busy == {}, f"state left 10 s after the client left ({leave}): {busy}"
    after = stats(url)
    aborts = {k: after[k]["aborts"] - before[k]["aborts"] for k in after}
    print(f"\n{leave}: clean {time.monotonic() - t0:.1f} s after the request; aborts {aborts}")
    # the talker and code2wav were still at work (the thinker may have handed over the given
    # answer in full already)
    assert aborts["talker"] >= 1 and aborts["code2wav"] >= 1, aborts
    assert busy_stages(after) == {}
    short = httpx.post(f"{url}/v1/audio/speech", timeout=180, json=_body(
        input="Still here.", max_audio_frames=6))
    assert short.status_code == 200 and len(short.content) == (6 * 1920 - 555) * 2
