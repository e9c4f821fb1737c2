"""Payload: the typed chunks that cross stage boundaries, and their lossless binary codec.

Imports only torch and numpy (never Ray or other omni_ray packages), so every layer can speak it.
"""

from omni_ray.payload.chunks import (
    CHUNK_TYPES,
    AudioChunk,
    Chunk,
    CodecChunk,
    FinishReason,
    TextDelta,
    ThinkerChunk,
)
from omni_ray.payload.codec import decode, decode_chunk, encode, encode_chunk
from omni_ray.payload.errors import PayloadDecodeError, PayloadEncodeError, PayloadError
from omni_ray.payload.kv import KVChunk
from omni_ray.payload.mm import MultiModalInputs

__all__ = [
    "CHUNK_TYPES",
    "AudioChunk",
    "Chunk",
    "CodecChunk",
    "FinishReason",
    "KVChunk",
    "MultiModalInputs",
    "PayloadDecodeError",
    "PayloadEncodeError",
    "PayloadError",
    "TextDelta",
    "ThinkerChunk",
    "decode",
    "decode_chunk",
    "encode",
    "encode_chunk",
]
