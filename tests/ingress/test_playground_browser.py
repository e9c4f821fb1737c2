"""The browser playground end to end: the real Serve app on the tiny checkpoint, driven by
Debian's Chromium (headless) through Playwright. Needs ``apt-get install chromium`` and
``pip install playwright`` (no ``playwright install``: the system browser is used)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, CHROMIUM_ARGS, KEY_STORAGE, playwright_sync_api
from pydantic import SecretStr

API_KEY = "playground-test-key"
ARTIFACTS = Path(__file__).parent / "artifacts"
sync_api = playwright_sync_api()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def base_url(serve_base_url, tiny_model_dir):
    """The whole app over real HTTP, with an API key and (tests only) fault injection on, at
    the root of the session's Serve (the playground's pages are at / and /playground)."""
    from ray import serve

    from omni_ray import build_omni_app

    serve.run(build_omni_app({"model": tiny_model_dir,
                              "security": {"api_keys": [SecretStr(API_KEY)], "api_keys_env": None,
                                           "allow_fault_injection": True}}),
              name="omni-playground", route_prefix="/")
    yield serve_base_url
    serve.delete("omni-playground")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    yield context.new_page()
    context.close()


def _state(page) -> dict:
    return page.evaluate("() => ({...window.__playground})")


def _send(page, text: str) -> dict:
    """Type ``text``, click Send; the request body the page posted."""
    page.fill("#message", text)
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    return req.value.post_data_json


def test_streams_text_and_plays_audio(page, base_url, tmp_path):
    page.add_init_script(f"localStorage.setItem({KEY_STORAGE!r}, {API_KEY!r})")
    page.goto(f"{base_url}/")  # "/" serves the page too
    page.wait_for_function("() => window.__playground.model !== null")
    page.select_option("#voice", "chelsie")
    page.check("input[name=modalities][value=both]")
    page.fill("#max-tokens", "24")

    body = _send(page, "Hello there, how are you?")
    page.wait_for_function("() => window.__playground.text.length > 0 && "
                           "window.__playground.playbackStarted", timeout=180_000)
    page.wait_for_function("() => window.__playground.status.startsWith('done')", timeout=300_000)
    st = _state(page)

    # The page spoke OpenAI's API with the model named by GET /v1/models.
    assert body["model"] == "qwen3-omni" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["modalities"] == ["text", "audio"]
    assert body["audio"] == {"voice": "chelsie", "format": "pcm16"}
    assert body["messages"][-1] == {"role": "user", "content": "Hello there, how are you?"}
    # Text and audio were handled as they arrived, before the stream ended.
    assert 0 < st["firstTokenMs"] < st["doneMs"] and 0 < st["firstAudioMs"] < st["doneMs"]
    assert st["error"] is None and page.is_hidden("#error")
    assert st["text"] and page.inner_text(".msg.assistant .body") == st["text"]
    assert st["playbackStarted"] and st["audioChunksScheduled"] > 1 and st["audioSeconds"] > 0
    assert st["usage"]["completion_tokens"] > 0
    assert page.inner_text("#ttft").endswith(" ms") and page.inner_text("#ttfa").endswith(" ms")
    assert page.inner_text("#audio-duration").endswith("chunks)")
    # The audio-input controls are there (127.0.0.1 is a secure context: recording allowed).
    assert page.is_enabled("#record") and page.is_hidden("#attachment")

    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "playground.png")


def _open_with_key(page, base_url):
    page.add_init_script(f"localStorage.setItem({KEY_STORAGE!r}, {API_KEY!r})")
    page.goto(f"{base_url}/playground")
    page.wait_for_function("() => window.__playground.model !== null")
    page.check("input[name=modalities][value=both]")
    page.fill("#max-tokens", "8")


def _answered(page) -> dict:
    page.wait_for_function("() => /^(done|error)/.test(window.__playground.status)",
                           timeout=300_000)
    st = _state(page)
    assert st["status"].startswith("done") and st["error"] is None, st
    assert st["text"] and st["audioSeconds"] > 0
    return st


def test_uploaded_audio_is_sent_as_input_audio(page, base_url, tmp_path):
    import base64
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from media_samples import audio_bytes, tone

    clip = tmp_path / "question.wav"
    clip.write_bytes(audio_bytes(tone(1.2), 24000, "wav", "PCM_16"))
    _open_with_key(page, base_url)
    page.set_input_files("#audio-file", str(clip))
    page.wait_for_function("() => window.__playground.attachment !== null")
    assert page.inner_text("#attachment-label").startswith("🎤 question.wav (1.2 s, wav)")
    body = _send(page, "What did I say?")
    assert body["messages"][-1] == {"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip.read_bytes()).decode(),
                                                "format": "wav"}},
        {"type": "text", "text": "What did I say?"}]}
    assert page.is_hidden("#attachment")  # sent with this message only
    st = _answered(page)
    assert st["usage"]["prompt_tokens"] > 15 + 10  # 1.2 s of audio: 13 placeholder tokens / s


def test_microphone_recording_is_sent_as_wav(page, base_url):
    _open_with_key(page, base_url)
    page.click("#record")
    page.wait_for_function("() => window.__playground.recording")
    page.wait_for_timeout(1500)
    page.click("#record")
    page.wait_for_function("() => window.__playground.attachment !== null", timeout=30_000)
    assert _state(page)["attachment"]["seconds"] > 0.5
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")  # no text: the recording alone is the question
    (part,) = req.value.post_data_json["messages"][-1]["content"]
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    _answered(page)


def test_routes_serve_the_files_and_nothing_else(base_url):
    import httpx

    with httpx.Client(base_url=base_url, timeout=30) as http:
        for path in ("/", "/playground"):
            r = http.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert http.get("/static/playground.js").headers["content-type"].startswith("text/javascript")
        assert http.get("/static/playground.css").headers["content-type"].startswith("text/css")
        for bad in ("/static/..%2Fapp.py", "/static/%2e%2e", "/static/playground.html",
                    "/static/nope.js"):
            r = http.get(bad)
            assert r.status_code == 404 and "OmniIngress" not in r.text, bad


def test_http_errors_are_shown(page, base_url):
    """A 4xx from the server is shown with OpenAI's ``error.message``."""
    page.goto(f"{base_url}/playground")
    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")  # saved for the next visit, models reloaded
    assert page.evaluate(f"localStorage.getItem({KEY_STORAGE!r})") == API_KEY
    page.wait_for_function("() => window.__playground.model !== null")
    page.fill("#max-tokens", "5000")  # over limits.max_tokens (1024)
    _send(page, "hi")
    page.wait_for_function("() => window.__playground.status === 'error'")
    assert page.is_visible("#error")
    err = page.inner_text("#error")
    assert "HTTP 400" in err and "max_tokens: 5000 is over limits.max_tokens=1024" in err


def test_bad_api_key_is_shown(page, base_url):
    page.goto(f"{base_url}/playground")  # no key stored: GET /v1/models is refused
    page.wait_for_selector("#error:not([hidden])", timeout=10_000)
    assert "HTTP 401" in page.inner_text("#error")
    assert "invalid API key" in page.inner_text("#error")


def test_stream_error_events_are_shown(page, base_url):
    """A stage failing mid-stream arrives as an SSE ``{"error": ...}`` event; the page shows it."""
    page.add_init_script(f"localStorage.setItem({KEY_STORAGE!r}, {API_KEY!r})")

    def with_fault(route):  # the tests-only header makes the talker fail this request
        route.continue_(headers={**route.request.headers, "x-omni-fault": "talker"})

    page.route("**/v1/chat/completions", with_fault)
    page.goto(f"{base_url}/playground")
    page.wait_for_function("() => window.__playground.model !== null")
    _send(page, "Tell me a story.")
    page.wait_for_function("() => window.__playground.status === 'error'", timeout=180_000)
    page.wait_for_selector("#error:not([hidden])")
    assert page.inner_text("#error").startswith("stream error:")
    assert "failed" in page.inner_text("#error")


SPEECH_FRAMES = 12  # the test's bound on the spoken answer (the page sends none: the API's bound)


def test_speak_this_text_plays_the_speech_answer(page, base_url):
    """"speak this text" posts the text to /v1/audio/speech (raw pcm) and plays the answer as it
    arrives: the page received exactly the bytes the same request gets over plain HTTP."""
    import json

    import httpx
    import numpy as np

    page.add_init_script(f"localStorage.setItem({KEY_STORAGE!r}, {API_KEY!r})")

    sent = []  # the bodies the page posted

    def bounded(route):  # the talker's length, for a quick test (the page's body is checked)
        sent.append(route.request.post_data_json)
        route.continue_(post_data=json.dumps(dict(sent[-1], max_audio_frames=SPEECH_FRAMES)))

    page.route("**/v1/audio/speech", bounded)
    page.goto(f"{base_url}/playground")
    page.wait_for_function("() => window.__playground.model !== null")
    page.select_option("#voice", "aiden")
    page.check("#speak-mode")
    page.fill("#message", "Read this aloud, please.")
    page.click("#send")
    page.wait_for_function("() => /^(done|error)/.test(window.__playground.status)",
                           timeout=300_000)
    assert sent == [{"model": "qwen3-omni", "input": "Read this aloud, please.", "voice": "aiden",
                     "response_format": "pcm"}]
    page.wait_for_function("() => window.__playground.playbackStarted", timeout=30_000)
    st = _state(page)
    assert st["status"] == "done (speech)" and st["error"] is None, st
    assert 0 < st["firstAudioMs"] <= st["doneMs"] and st["audioChunksScheduled"] >= 1

    r = httpx.post(f"{base_url}/v1/audio/speech", timeout=300,
                   headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": "qwen3-omni", "input": "Read this aloud, please.",
                         "voice": "aiden", "response_format": "pcm",
                         "max_audio_frames": SPEECH_FRAMES})
    pcm = np.frombuffer(r.content, "<i2")
    assert r.status_code == 200 and pcm.size == SPEECH_FRAMES * 1920 - 555
    assert st["speechBytes"] == len(r.content)
    total = int(pcm.astype(np.int64).sum())  # the page's sum wraps as a JS int32 (x | 0)
    assert st["speechChecksum"] == (total + 2**31) % 2**32 - 2**31
    assert st["audioSeconds"] == pytest.approx(pcm.size / 24000, abs=1e-6)
    assert page.inner_text(".msg.assistant .body").startswith("Read this aloud, please. (spoken:")
    assert not page.is_visible("#error")


def test_uploaded_image_is_sent_as_an_image_url(page, base_url, tmp_path):
    import base64
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from media_samples import image_bytes, picture

    png = tmp_path / "photo.png"
    png.write_bytes(image_bytes(picture()))
    _open_with_key(page, base_url)
    page.set_input_files("#image-file", str(png))
    page.wait_for_function("() => window.__playground.image !== null")
    assert page.inner_text("#image-label").startswith("🖼 photo.png (")
    body = _send(page, "What is in the picture?")
    assert body["messages"][-1] == {"role": "user", "content": [
        {"type": "image_url",
         "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()}},
        {"type": "text", "text": "What is in the picture?"}]}
    assert page.is_hidden("#image-attachment")  # sent with this message only
    st = _answered(page)
    # The server decoded the image and put its placeholder tokens in the prompt.
    assert st["usage"]["prompt_tokens_details"]["image_tokens"] > 0, st["usage"]
