"""omni_ray/ingress/playground.py without Ray: the allow-list and the content types."""

from __future__ import annotations

import re

import pytest

from omni_ray.ingress import playground
from omni_ray.ingress.errors import APIError


@pytest.mark.parametrize("name", ["playground.js", "playground.css"])
def test_static_files_are_served_with_their_type(name):
    resp = playground.static_response(name)
    assert resp.media_type == playground.STATIC_FILES[name]
    assert resp.body == (playground.STATIC_DIR / name).read_bytes()
    assert resp.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("name", ["../app.py", "..", "playground.html", "PLAYGROUND.JS",
                                  "/etc/passwd", "%2e%2e%2fapp.py", "playground.js/", ""])
def test_names_outside_the_allow_list_are_404(name):
    with pytest.raises(APIError) as e:
        playground.static_response(name)
    assert e.value.status == 404


def test_page_links_only_allow_listed_files_and_no_cdn():
    html = playground.page_response().body.decode()
    linked = set(re.findall(r'(?:src|href)="static/([^"]+)"', html))
    assert linked == set(playground.STATIC_FILES)
    assert "://" not in html  # nothing fetched from another origin
    js = (playground.STATIC_DIR / "playground.js").read_text()
    # Only the OpenAI-compatible endpoints.
    assert set(re.findall(r'url\("([^"]+)"\)', js)) == {"v1/models", "v1/chat/completions",
                                                          "v1/audio/voices", "v1/audio/speech"}
