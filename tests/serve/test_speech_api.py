"""The speech side of the API over real HTTP, driven by the openai client where it can: voices,
every audio format of a non-streamed answer (decoded by another library than the writer), usage
token details, multi-turn by ``audio.id``, and transcriptions equal to the chat path's answer."""

from __future__ import annotations

import base64
import io
import math
import shutil

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from audio_decoders import decode_faad, decode_pyav
from media_samples import audio_bytes, b64, tone
from openai import OpenAI

from omni_ray.ingress.transcribe import instruction

pytestmark = pytest.mark.slow

MODEL = "qwen3-omni"
PROMPT = "Say something nice."
FRAME = 1920  # samples of one 80 ms codec frame at 24 kHz: one audio token
WAV_IN = audio_bytes(tone(1.5), 24000, "wav", "PCM_16")


@pytest.fixture(scope="module")
def url(serve_urls):
    return serve_urls["async_chunk"]


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def chat(url, fmt="wav", messages=None, **kw):
    return client(url).chat.completions.create(
        model=MODEL, messages=messages or [{"role": "user", "content": PROMPT}],
        modalities=["text", "audio"], audio={"voice": "chelsie", "format": fmt}, max_tokens=8,
        extra_body={"max_audio_frames": 20}, **kw)


def test_voices_are_the_checkpoints_speakers(url):
    r = httpx.get(f"{url}/v1/audio/voices", timeout=30)
    assert r.status_code == 200
    assert r.json() == {"voices": ["aiden", "chelsie", "ethan"], "uploaded_voices": [],
                        "default": "ethan"}


@pytest.fixture(scope="module")
def pcm_answer(url):
    r = chat(url, "pcm16")
    return r, np.frombuffer(base64.b64decode(r.choices[0].message.audio.data), "<i2")


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_every_format_decodes_to_the_pcm16_answer(url, pcm_answer, fmt, tmp_path):
    ref, pcm = pcm_answer
    assert pcm.size > 0
    r = chat(url, fmt)
    msg = r.choices[0].message
    assert msg.audio.transcript == ref.choices[0].message.audio.transcript
    data = base64.b64decode(msg.audio.data)
    if fmt == "wav":  # written by the standard library: read by soundfile
        got, sr = sf.read(io.BytesIO(data), dtype="int16")
        assert sr == 24000 and np.array_equal(got, pcm)
        return
    if fmt == "aac":  # written by PyAV: read by libfaad2
        if shutil.which("faad") is None:
            pytest.skip("faad (Debian's libfaad2 decoder) is not installed")
        got, sr = decode_faad(data, tmp_path)
    else:  # written by soundfile: read by PyAV
        got, sr = decode_pyav(data)
    if fmt == "flac":  # lossless
        assert sr == 24000
        assert np.array_equal(np.rint(got * 32768).astype(np.int32), pcm.astype(np.int32))
    else:
        assert abs(got.size / sr - pcm.size / 24000) < 0.1, (fmt, got.size, sr, pcm.size)
        assert np.abs(got).max() > 0.01  # not silence


def test_streaming_another_format_is_a_400_naming_audio_format(url):
    with pytest.raises(openai.BadRequestError) as e:
        list(chat(url, "mp3", stream=True))
    assert e.value.body["param"] == "audio.format" and "mp3" in e.value.body["message"]


def test_usage_counts_text_and_audio_tokens(url, pcm_answer):
    r, pcm = pcm_answer
    u = r.usage
    d, p = u.completion_tokens_details, u.prompt_tokens_details
    assert d.text_tokens == 8
    assert d.audio_tokens == math.ceil(pcm.size / FRAME) > 0
    assert d.audio_tokens <= 20  # max_audio_frames
    assert u.completion_tokens == d.text_tokens + d.audio_tokens
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert p.text_tokens == u.prompt_tokens and p.audio_tokens == 0 and p.cached_tokens == 0
    # Streamed, the same counts.
    chunks = list(chat(url, "pcm16", stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.model_dump() == u.model_dump()
    # Audio in: its placeholder tokens are the prompt's audio tokens.
    r = client(url).chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": b64(WAV_IN), "format": "wav"}},
            {"type": "text", "text": "What is this?"}]}])
    p = r.usage.prompt_tokens_details
    assert p.audio_tokens > 0 and p.text_tokens + p.audio_tokens == r.usage.prompt_tokens
    assert r.usage.completion_tokens_details.audio_tokens == 0


def test_a_later_turn_names_an_earlier_spoken_answer_by_its_id(url, pcm_answer):
    first, _ = pcm_answer
    audio = first.choices[0].message.audio
    assert audio.expires_at > 0 and audio.transcript
    follow = {"role": "user", "content": "And then?"}
    by_id = chat(url, "pcm16", messages=[{"role": "user", "content": PROMPT},
                                         {"role": "assistant", "audio": {"id": audio.id}}, follow])
    by_text = chat(url, "pcm16", messages=[{"role": "user", "content": PROMPT},
                                           {"role": "assistant", "content": audio.transcript},
                                           follow])
    assert by_id.choices[0].message.audio.transcript == by_text.choices[0].message.audio.transcript
    assert by_id.usage.prompt_tokens == by_text.usage.prompt_tokens
    assert by_id.choices[0].message.audio.data == by_text.choices[0].message.audio.data


def test_a_streamed_answers_id_works_too(url):
    ids = set()
    for ch in chat(url, "pcm16", stream=True):
        for c in ch.choices:
            a = c.delta.audio if hasattr(c.delta, "audio") else (c.delta.model_extra or {}).get(
                "audio")
            if a:
                ids.add(a["id"] if isinstance(a, dict) else a.id)
    (audio_id,) = ids
    r = chat(url, "pcm16", messages=[{"role": "user", "content": PROMPT},
                                     {"role": "assistant", "audio": {"id": audio_id}},
                                     {"role": "user", "content": "More."}])
    assert r.choices[0].message.audio.data


@pytest.mark.parametrize("audio, param", [
    ({"id": "audio_nope"}, "messages.1.audio.id"),
    ({"id": "audio_x", "data": "AAAA"}, "messages.1.audio.data"),
])
def test_an_unknown_audio_id_is_a_400_naming_it(url, audio, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(url, "pcm16", messages=[{"role": "user", "content": PROMPT},
                                     {"role": "assistant", "audio": audio},
                                     {"role": "user", "content": "More."}])
    assert e.value.body["param"] == param


def test_audio_id_on_a_user_turn_is_a_400(url):
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.audio"


def chat_transcript(url, data: bytes, **kw) -> str:
    """The chat path's answer to the transcription request's audio + instruction."""
    r = client(url).chat.completions.create(
        model=MODEL, modalities=["text"], temperature=0.0, max_tokens=64,
        messages=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": b64(data), "format": "wav"}},
            {"type": "text", "text": instruction(**kw)}]}])
    return r.choices[0].message.content


def test_transcription_is_the_chat_paths_answer(url):
    c = client(url)
    want = chat_transcript(url, WAV_IN)
    got = c.audio.transcriptions.create(model=MODEL, file=("clip.wav", WAV_IN, "audio/wav"))
    assert got.text == want and want
    assert got.usage.input_tokens > got.usage.input_token_details.audio_tokens > 0
    text = c.audio.transcriptions.create(model=MODEL, file=("clip.wav", WAV_IN),
                                         response_format="text")
    assert text.strip() == want.strip()
    verbose = c.audio.transcriptions.create(model=MODEL, file=("clip.wav", WAV_IN),
                                            response_format="verbose_json", language="en")
    assert verbose.text == chat_transcript(url, WAV_IN, language="en")
    assert verbose.language == "en" and abs(verbose.duration - 1.5) < 0.01


@pytest.mark.parametrize("kw, param", [
    ({"response_format": "srt"}, "response_format"),
    ({"timestamp_granularities": ["word"]}, "timestamp_granularities[]"),
    ({"include": ["logprobs"]}, "include[]"),
    ({"extra_body": {"speed": "2"}}, "speed"),
    ({"model": "whisper-1"}, "model"),
])
def test_transcription_fields_it_cannot_honour_are_400s_naming_them(url, kw, param):
    kw = {"model": MODEL, **kw}
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as e:
        client(url).audio.transcriptions.create(file=("clip.wav", WAV_IN), **kw)
    assert e.value.body["param"] == param


def test_transcription_of_a_non_audio_file_is_a_400_naming_file(url):
    with pytest.raises(openai.BadRequestError) as e:
        client(url).audio.transcriptions.create(model=MODEL, file=("x.wav", b"not audio at all"))
    assert e.value.body["param"] == "file"


def test_the_speech_example_runs(url, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "speech_client.py"
    spec = importlib.util.spec_from_file_location("speech_client", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "a.mp3"
    assert mod.main(["--url", f"{url}/v1", "--format", "mp3", "--out", str(out),
                     "--max-tokens", "6"]) == 0
    assert out.read_bytes()[:2] in (b"\xff\xf3", b"\xff\xfb", b"ID")
    printed = capsys.readouterr().out
    assert "voices: aiden, chelsie, ethan (using ethan)" in printed and "follow-up:" in printed
    out = tmp_path / "a.wav"
    assert mod.main(["--url", f"{url}/v1", "--out", str(out), "--max-tokens", "6"]) == 0
    assert "transcription of" in capsys.readouterr().out
