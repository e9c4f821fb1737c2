"""The playground's "talk" mode (static/talk.js) end to end: the real Serve app on the tiny
checkpoint, Debian's Chromium (headless, through Playwright) with a fake microphone: Chromium's
beep for hold-to-talk, and a spoken question (espeak-ng, looped by Chromium) for hands-free mode,
where the question coming round again interrupts the answer playing."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from browser_helpers import CHROMIUM, CHROMIUM_ARGS, KEY_STORAGE, playwright_sync_api
from pydantic import SecretStr

KEY = "talk-test-key"
sync_api = playwright_sync_api()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def base_url(serve_base_url, tiny_model_dir):
    from ray import serve

    from omni_ray import build_omni_app

    serve.run(build_omni_app({
        "model": tiny_model_dir,
        "limits": {"default_max_tokens": 8, "default_max_audio_frames": 60},
        "security": {"api_keys": [SecretStr(KEY)], "api_keys_env": None}}),
        name="omni-talk", route_prefix="/talk")
    yield f"{serve_base_url}/talk"
    serve.delete("omni-talk")


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> str:
    """A spoken question then 2.5 s of silence (Chromium loops the file as the microphone)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/install.sh installs Debian's)")
    import soundfile as sf

    d = tmp_path_factory.mktemp("talk")
    subprocess.run(["espeak-ng", "-w", str(d / "q.wav"), "Where is the nearest train station?"],
                   check=True)
    x, sr = sf.read(d / "q.wav", dtype="float32")
    x = np.concatenate([np.zeros(sr // 4, "float32"), x, np.zeros(int(2.5 * sr), "float32")])
    sf.write(d / "mic.wav", x, sr, subtype="PCM_16")
    return str(d / "mic.wav")


def _page(pw, args, base_url):
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=args)
    page = browser.new_context().new_page()
    page.add_init_script(f"localStorage.setItem({KEY_STORAGE!r}, {KEY!r})")
    page.goto(f"{base_url}/playground")
    page.wait_for_function("() => window.__playground.model !== null")
    page.fill("#max-tokens", "8")
    return browser, page


def _talk(page) -> dict:
    return page.evaluate("() => ({...window.__talk})")


def test_hold_to_talk_answers_and_plays(base_url):
    with sync_api.sync_playwright() as pw:
        browser, page = _page(pw, CHROMIUM_ARGS, base_url)
        try:
            page.select_option("#talk-mode", "hold")
            page.click("#talk")
            page.wait_for_function("() => window.__talk.open && "
                                   "window.__talk.events.includes('session.updated')")
            box = page.locator("#talk-hold").bounding_box()
            page.mouse.move(box["x"] + 5, box["y"] + 5)
            page.mouse.down()
            page.wait_for_function("() => window.__talk.packetsSent >= 25")  # about 1 s
            page.mouse.up()
            page.wait_for_function("() => window.__talk.responses >= 1", timeout=120_000)
            t = _talk(page)
            assert t["error"] is None, t["error"]
            ev = t["events"]
            assert ev.index("input_audio_buffer.committed") < ev.index("response.created") \
                < ev.index("response.output_audio.delta") < ev.index("response.done")
            assert t["audioDeltas"] > 0 and t["audioSeconds"] > 0 and t["transcript"]
            assert t["lastStatus"] in ("completed", "incomplete")
            page.wait_for_function("() => window.__talk.playing || window.__talk.audioSeconds > 0")
            page.click("#talk")  # stop: the socket closes
            page.wait_for_function("() => !window.__talk.open")
        finally:
            browser.close()


def test_hands_free_turns_and_interruption(base_url, question_wav):
    args = CHROMIUM_ARGS + [f"--use-file-for-fake-audio-capture={question_wav}"]
    with sync_api.sync_playwright() as pw:
        browser, page = _page(pw, args, base_url)
        try:
            page.select_option("#talk-mode", "vad")
            page.click("#talk")
            # first turn answered, then the question comes round again over the answer
            page.wait_for_function("() => window.__talk.responses >= 1 && "
                                   "window.__talk.audioDeltas > 0", timeout=120_000)
            page.wait_for_function("() => window.__talk.playbackInterrupted >= 1 && "
                                   "window.__talk.responses >= 2", timeout=120_000)
            t = _talk(page)
            assert t["error"] is None, t["error"]
            ev = t["events"]
            assert ev.count("input_audio_buffer.speech_started") >= 2
            assert ev.index("input_audio_buffer.speech_stopped") < ev.index("response.created")
            artifacts = os.path.join(os.path.dirname(__file__), "artifacts")
            os.makedirs(artifacts, exist_ok=True)
            page.screenshot(path=os.path.join(artifacts, "playground_talk.png"))
        finally:
            browser.close()
