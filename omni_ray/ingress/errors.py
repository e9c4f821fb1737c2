"""Errors in OpenAI's schema: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    """An error answered with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


async def api_error_handler(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


# pydantic error types answered with an OpenAI-style ``code``.
_CODES = {"unsupported_parameter": "unsupported_parameter", "extra_forbidden": "unknown_parameter",
          "invalid_content_part": "invalid_content_part"}


async def validation_error_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    errs = exc.errors()
    body_err = _body_error(errs)
    if body_err is not None:
        return JSONResponse(body_err.body(), status_code=400)
    # The most specific error: pydantic reports one per union branch ("content" as a str, then
    # as a list of parts); the deepest location is the one the client got wrong.
    first = max(errs, key=lambda e: len(e.get("loc", ())), default=None) or {
        "loc": (), "msg": "invalid request"}
    param = _param(first.get("loc", ())) or None
    kind = first.get("type")
    text = "unrecognized request argument" if kind == "extra_forbidden" else first.get("msg")
    msg = f"{param}: {text}" if param else str(text)
    return JSONResponse(APIError(400, msg, param=param, code=_CODES.get(kind)).body(),
                        status_code=400)


def _body_error(errs: list[dict]) -> APIError | None:
    """Errors of the body as a whole (not of a field): ``param`` is null."""
    for e in errs:
        loc, kind = tuple(e.get("loc", ())), e.get("type")
        if kind == "json_invalid":  # loc is ("body", <byte offset>): the offset is no field
            pos = loc[1] if len(loc) > 1 else "?"
            why = (e.get("ctx") or {}).get("error", "invalid JSON")
            return APIError(400, f"the request body is not valid JSON ({why} at position {pos})",
                            code="invalid_json")
        if loc == ("body",) and kind == "missing":
            return APIError(400, "a request body is required (a JSON object)",
                            code="missing_body")
        if loc == ("body",):
            return APIError(400, "the request body must be a JSON object", code="invalid_body")
    return None


def _param(loc) -> str:
    """pydantic's error location as a field path: no "body", no union-branch labels
    ("str", "list[tagged-union[...]]"), a discriminator tag not repeated before its field."""
    out: list[str] = []
    for p in loc:
        p = str(p)
        if p == "body" or "[" in p or p in ("str", "int", "float", "bool", "list", "dict"):
            continue
        if out and out[-1] == p:
            continue
        out.append(p)
    return ".".join(out)


_HTTP_TYPES = {404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error"}


async def http_error_handler(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own errors (unknown path, wrong method, ...) in OpenAI's schema."""
    status = exc.status_code
    kind = _HTTP_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    err = APIError(status, str(exc.detail), type=kind)
    return JSONResponse(err.body(), status_code=status, headers=getattr(exc, "headers", None))


async def unhandled_error_handler(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}",
                                 type="server_error").body(), status_code=500)
