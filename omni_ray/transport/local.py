"""In-process transport: every chunk goes through the wire codec, as it would between actors.

The offline pipeline uses it so that a lossy encode/decode (a dropped field, a lost tensor) changes
offline answers and fails the oracle tests, instead of hiding until deployment.
"""

from __future__ import annotations

from omni_ray.payload import decode_chunk, encode_chunk


def send_local(chunk):
    """Encode then decode ``chunk``; returns the receiver's copy."""
    return decode_chunk(encode_chunk(chunk), expected_type=type(chunk))
