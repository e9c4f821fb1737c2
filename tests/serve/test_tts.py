"""``POST /v1/audio/speech`` over real HTTP with the ``openai`` client: the talker voices exactly
the given text (the thinker is given it as its answer), equal to the offline pipeline's
``Omni.speech_request`` (float32, tiny checkpoint), in every answer shape (file, raw pcm stream,
SSE), and a 400 naming the field for what the model cannot do."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
from audio_decoders import decode_pyav
from openai import OpenAI

from omni_ray.audio import to_pcm16

pytestmark = pytest.mark.slow

MODEL = "qwen3-omni"
TEXT = "Hello world, this is omni ray speaking."
FRAMES = 24
SPF, TAIL = 1920, 555  # samples per 80 ms frame; samples a decode withholds at the end


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def reference(offline):
    """The offline pipeline's answer to the same text, voice and frame bound."""
    omni = offline["sync"]
    out = omni.generate(omni.speech_request(TEXT, speaker="chelsie", max_audio_frames=FRAMES))[0]
    assert out.error is None
    return omni, out


def _wav_samples(data: bytes) -> np.ndarray:
    x, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == 24000
    return x


def test_speaks_exactly_the_input(reference):
    omni, out = reference
    ids = omni.tokenizer(TEXT, add_special_tokens=False).input_ids
    assert out.text_token_ids == ids + [omni.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert out.codec_frames.shape[0] > 0


@pytest.mark.parametrize("mode", ["async_chunk", "sync"])
def test_wav_equals_the_offline_pipeline(serve_urls, reference, mode):
    _, out = reference
    audio = client(serve_urls[mode]).audio.speech.create(
        model=MODEL, voice="chelsie", input=TEXT, response_format="wav",
        extra_body={"max_audio_frames": FRAMES})
    got = _wav_samples(audio.content)
    want = np.frombuffer(to_pcm16(out.audio), "<i2")
    assert got.size == want.size == out.codec_frames.shape[0] * SPF - TAIL
    assert np.abs(got.astype(np.int32) - want).max() <= 1


def test_pcm_stream_and_sse_carry_the_same_audio(serve_urls, reference):
    url = serve_urls["async_chunk"]
    _, out = reference
    want = to_pcm16(out.audio)
    with client(url).audio.speech.with_streaming_response.create(
            model=MODEL, voice="chelsie", input=TEXT, response_format="pcm",
            extra_body={"max_audio_frames": FRAMES}) as resp:
        assert resp.headers["content-type"].startswith("audio/pcm")
        pieces = list(resp.iter_bytes())
    assert len(pieces) >= 1 and _close(b"".join(pieces), want)

    deltas, done = [], None
    with httpx.stream("POST", f"{url}/v1/audio/speech", timeout=180, json={
            "model": MODEL, "voice": "chelsie", "input": TEXT, "response_format": "pcm",
            "stream_format": "sse", "max_audio_frames": FRAMES}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                ev = json.loads(line[6:])
                if ev["type"] == "speech.audio.delta":
                    deltas.append(base64.b64decode(ev["audio"]))
                else:
                    done = ev
    assert _close(b"".join(deltas), want)
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["output_tokens"] >= out.codec_frames.shape[0]  # audio tokens + text


def test_default_mp3_decodes(serve_urls, reference):
    _, out = reference
    audio = client(serve_urls["async_chunk"]).audio.speech.create(
        model=MODEL, voice="chelsie", input=TEXT, extra_body={"max_audio_frames": FRAMES})
    x, sr = decode_pyav(audio.content)  # written by libsndfile, read by FFmpeg
    assert sr == 24000 and abs(x.size - out.audio.numel()) <= 2 * 1152  # mp3 frame padding


@pytest.mark.parametrize("patch, param", [
    ({"speed": 1.5}, "speed"),
    ({"instructions": "Speak like a pirate."}, "instructions"),
    ({"voice": "no-such-voice"}, "voice"),
    ({"voice": {"id": "no-such-voice"}}, "voice.id"),
    ({"input": "   "}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"response_format": "mp3", "stream_format": "sse"}, "stream_format"),
    ({"response_format": "ogg"}, "response_format"),
    ({"volume": 2}, "volume"),
    ({"model": "gpt-4o-mini-tts"}, "model"),
])
def test_what_the_model_cannot_do_is_a_400_naming_the_field(serve_urls, patch, param):
    body = {"model": MODEL, "voice": "ethan", "input": "Hi.", **patch}
    r = httpx.post(f"{serve_urls['async_chunk']}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param or err["message"].startswith(param), err


def _close(got: bytes, want: bytes) -> bool:
    a, b = np.frombuffer(got, "<i2").astype(np.int32), np.frombuffer(want, "<i2").astype(np.int32)
    return a.size == b.size and bool(np.abs(a - b).max() <= 1)
