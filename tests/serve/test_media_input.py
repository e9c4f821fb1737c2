"""Audio and image input over real HTTP: the openai client's content parts, answers equal to the
offline pipeline's, and clear 4xx errors for malformed, oversized and unsupported media."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from media_helpers import CASES, MP3, WAV, ask, audio_part, image_part, offline_answer
from media_samples import audio_bytes, image_bytes, picture
from serve_helpers import wait_clean

pytestmark = pytest.mark.slow

MODES = ("async_chunk", "sync")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_media_answers_equal_offline(serve_urls, offline, mode, case):
    parts, media = CASES[case]
    url = serve_urls[mode]
    ref_text, ref_pcm = offline_answer(offline[mode], media)
    for stream in (True, False):
        text, pcm = ask(url, parts, stream)
        assert text == ref_text
        assert pcm.shape == ref_pcm.shape and np.abs(ref_pcm).max() > 1000
        assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1
    assert wait_clean(url, 10) == {}


# -- errors --------------------------------------------------------------------------------------
def post(url: str, parts: list[dict], role: str = "user") -> httpx.Response:
    body = {"model": "qwen3-omni", "max_tokens": 4,
            "messages": [{"role": role, "content": parts + [{"type": "text", "text": "hi"}]}]}
    if role != "user":
        body["messages"].append({"role": "user", "content": "hi"})
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def long_wav(seconds: float) -> bytes:
    """A long clip that stays small: 8 kHz, 8-bit."""
    return audio_bytes(np.zeros(int(seconds * 8000), np.float32), 8000, "wav", "PCM_U8")


ERRORS = {
    "garbage-audio": ([audio_part(b"RIFF" + bytes(100))], "content.0.input_audio.data",
                      "invalid_audio", "cannot decode the audio as wav"),
    "not-base64": ([{"type": "input_audio", "input_audio": {"data": "@@@@", "format": "wav"}}],
                   "content.0.input_audio.data", "invalid_base64", "not valid base64"),
    "mp3-declared-wav": ([audio_part(MP3, "wav")], "content.0.input_audio.format",
                         "invalid_audio_format", "not the declared format 'wav'"),
    "flac": ([audio_part(WAV, "flac")], "input_audio.format", None, "format"),
    "too-long": ([audio_part(long_wav(301))], "content.0.input_audio.data", "audio_too_long",
                 "limits.max_audio_seconds=300"),
    "garbage-image": ([image_part(b"\x89PNG\r\n\x1a\n" + bytes(64))], "content.0.image_url.url",
                      "invalid_image", "cannot decode the image"),
    "text-data-url": ([image_part(b"hello", "text/plain")], "content.0.image_url.url",
                      "invalid_image", "not an image"),
    "huge-image": ([image_part(image_bytes(__import__("PIL.Image").Image.new("L", (4097, 4096))))],
                   "content.0.image_url.url", "image_too_large",
                   "over limits.max_image_pixels=16777216"),
    "too-many": ([image_part(image_bytes(picture(8, 8)))] * 17, "messages",
                 "too_many_media_parts", "limits.max_media_parts=16"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_bad_media_gets_a_400_naming_the_field(serve_urls, name):
    parts, param, code, words = ERRORS[name]
    r = post(serve_urls["async_chunk"], parts)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].endswith(param) and words in err["message"], err
    if code:
        assert err["code"] == code


def test_media_outside_user_turns_is_refused(serve_urls):
    r = post(serve_urls["async_chunk"], [image_part()], role="system")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_content" and "user messages only" in err["message"]


def test_server_survives_bad_media(serve_urls):
    """After every refusal above, a media request still gets its answer and nothing leaks."""
    url = serve_urls["async_chunk"]
    for parts, *_ in ERRORS.values():
        post(url, parts)
    text, pcm = ask(url, [audio_part(WAV)], stream=True, max_tokens=4, frames=8)
    assert text and pcm.size
    assert wait_clean(url, 10) == {}
