"""Debian's Chromium through Playwright, shared by the playground's browser tests."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required",
                 # a fake microphone (a beep), granted without a prompt
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
KEY_STORAGE = "omni_ray.playground.apiKey"  # as in playground.js


def playwright_sync_api():
    """Playwright's sync API; skips the calling test module when Chromium or Playwright is
    missing (with CI=true a skip fails the run: tests/conftest.py)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found (apt-get install -y chromium)", allow_module_level=True)
    return pytest.importorskip("playwright.sync_api",
                               reason="playwright not installed (pip install playwright)")
