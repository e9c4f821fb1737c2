"""Speech and transcription through the ingress's ``DeploymentHandle`` (issue 21): a driver
process that never imports torch (``handle_speech_driver.py``) gets, from ``speak``, the same
audio ``POST /v1/audio/speech`` answers over HTTP (``openai`` client, raw pcm) and, from
``transcribe``, the same text and usage as ``POST /v1/audio/transcriptions``; every value it
receives is a plain Python or numpy value, torch never enters its ``sys.modules``, and invalid
requests raise ``ValueError`` naming the field."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("handle_speech_driver.py")
PLAIN = {"builtins.str", "builtins.int", "builtins.float", "builtins.bytes", "builtins.dict",
         "numpy.ndarray"}
MODEL, TEXT, VOICE, FRAMES = "qwen3-omni", "Handles speak too.", "aiden", 14


def _question_wav() -> bytes:
    t = np.arange(int(1.0 * 16000)) / 16000
    x = (0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(x.tobytes())
    return buf.getvalue()


def test_speak_and_transcribe_through_a_handle_without_torch(serve_urls, tmp_path):
    import ray

    url = serve_urls["async_chunk"]
    wav = tmp_path / "question.wav"
    wav.write_bytes(_question_wav())
    speech = {"model": MODEL, "input": TEXT, "voice": VOICE, "max_audio_frames": FRAMES}
    env = {k: v for k, v in os.environ.items()  # a user's driver (see test_handle_no_torch)
           if k not in ("PYTHONSTARTUP", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS")}
    proc = subprocess.run([sys.executable, str(DRIVER), ray.get_runtime_context().gcs_address,
                           "omni-async_chunk", json.dumps(speech), str(wav)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    # Plain values only, and no torch in the driver.
    assert got["torch_imported"] is False
    assert set(got["value_types"]) <= PLAIN, got["value_types"]
    assert got["kinds"][-1] == "done" and set(got["kinds"][:-1]) == {"audio"}, got["kinds"]
    assert got["samples_match_pcm16"]

    # The same audio as the HTTP route's raw pcm answer.
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=180)
    http_pcm = client.audio.speech.create(model=MODEL, input=TEXT, voice=VOICE,
                                          response_format="pcm",
                                          extra_body={"max_audio_frames": FRAMES}).content
    a = np.frombuffer(base64.b64decode(got["pcm16"]), "<i2").astype(np.int32)
    b = np.frombuffer(http_pcm, "<i2").astype(np.int32)
    assert a.size == b.size == FRAMES * 1920 - 555 and np.abs(a - b).max() <= 1
    done = got["done"]
    assert done["text"] == TEXT and done["finish_reason"] == "stop"
    assert done["usage"]["completion_tokens_details"]["audio_tokens"] == FRAMES

    # The same transcription as the HTTP route's.
    with open(wav, "rb") as f:
        http_tr = client.audio.transcriptions.create(model=MODEL, file=f)
    assert got["transcript"]["text"] == http_tr.text and http_tr.text
    assert got["transcript"]["usage"] == http_tr.usage.model_dump(exclude_none=True)

    # Invalid requests are ValueErrors naming the field.
    errs = got["errors"]
    assert errs["speak"]["value_error"] and "speed" in errs["speak"]["message"], errs
    assert errs["transcribe"]["value_error"] and "file" in errs["transcribe"]["message"], errs
