"""Errors raised by payload validation and the payload codec.

Every problem with a payload is a `PayloadError`, so a stage can catch one type and fail just the
request that carried the bad payload. The two subclasses say which side found it: the encoder
(a programming error in the producing stage) or the decoder (a corrupt, truncated or
incompatible buffer). Both carry an optional `path` such as `chunk.mm_hidden` or
`obj['frames'][2]` naming where in the value the problem sits.
"""

from __future__ import annotations


class PayloadError(ValueError):
    """A payload value is malformed: wrong type, shape, dtype or range.

    `message` says what is wrong; `path` (optional) says where, e.g. a chunk field name.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.message = message
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class PayloadEncodeError(PayloadError):
    """A value cannot be encoded: unsupported type, invalid chunk, or unreadable tensor."""


class PayloadDecodeError(PayloadError):
    """A buffer cannot be decoded: truncated, wrong version, unknown tag, or bad offsets."""
