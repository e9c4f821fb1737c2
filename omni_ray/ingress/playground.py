"""The browser playground: one HTML page plus its JS and CSS, shipped in ``ingress/static/``.

The page speaks only the OpenAI-compatible API (``GET /v1/models``, ``GET /v1/audio/voices``,
streaming ``POST /v1/chat/completions`` with text, recorded or uploaded audio and uploaded images
as ``image_url`` data URLs, ``POST /v1/audio/speech`` for "speak this text", and ``WS
/v1/realtime`` for "talk": hold-to-talk or server VAD, with interruption); these helpers
just hand out the files. Static names are looked up
in an allow-list, so a request can never reach another file (no path traversal).
"""

from __future__ import annotations

from pathlib import Path

from fastapi.responses import Response

from omni_ray.ingress.errors import APIError

STATIC_DIR = Path(__file__).with_name("static")
PAGE = "playground.html"
# name -> content type; the only files /static/{name} serves.
STATIC_FILES = {
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
    "talk.js": "text/javascript; charset=utf-8",  # "talk" mode over WS /v1/realtime
}
# Same-origin scripts, styles and fetches only: no inline code, no CDN.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'",
}


def page_response() -> Response:
    """The playground HTML (served at ``/`` and ``/playground``)."""
    return _file(PAGE, "text/html; charset=utf-8")


def static_response(name: str) -> Response:
    """One allow-listed static file; any other name is a 404."""
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise APIError(404, f"static file {name!r} not found", type="not_found_error")
    return _file(name, media_type)


def _file(name: str, media_type: str) -> Response:
    return Response((STATIC_DIR / name).read_bytes(), media_type=media_type, headers=_HEADERS)
