"""The one error type of input decoding: a client mistake, answered with a 400."""

from __future__ import annotations


class InputError(ValueError):
    """Bad media in a request. ``field`` is the offending field relative to the content part
    (``input_audio.data``), ``code`` the OpenAI-style error code."""

    def __init__(self, message: str, field: str, code: str):
        super().__init__(message, field, code)
        self.message, self.field, self.code = message, field, code

    def __str__(self) -> str:
        return self.message
