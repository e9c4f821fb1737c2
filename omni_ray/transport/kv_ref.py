"""How a request's prompt KV moves: one ``ray.put`` by the sender, one fetch by the receiver.

The sender (prefill engine) encodes a ``KVChunk`` with the wire codec and ``ray.put``s it; its
process owns the object. The ``KVHandle`` (a small, picklable struct holding the ref) travels to
the ingress, which keeps the object alive for exactly as long as it holds the handle, and passes
it to the receiver (decode engine) as the argument of one short actor call, so no long-lived task
pins the object. The receiver fetches under a timeout and decodes into its own copy.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from omni_ray.kv_lifecycle import KVState, KVTransferError
from omni_ray.payload import KVChunk, decode_chunk, encode_chunk


@dataclass(frozen=True)
class KVHandle:
    """Where one request's KV waits, plus what the receiver checks it against."""

    request_id: str
    ref: object        # ray.ObjectRef of encode_chunk(KVChunk): a 1-D uint8 buffer
    num_tokens: int    # prompt tokens covered
    nbytes: int        # size of the encoded buffer (what moves)
    first_token: int


@dataclass(frozen=True)
class KVProgress:
    """One step of the sender's work, streamed to the ingress (``prefill``'s items)."""

    request_id: str
    state: KVState            # HELD (prompt ran, cache held) or EXTRACTED (saved and freed)
    first_token: int
    num_tokens: int
    seconds: float            # sender-side time spent on this step
    handle: KVHandle | None = None  # EXTRACTED only


def put_kv(chunk: KVChunk) -> KVHandle:
    """Encode and ``ray.put`` one request's KV (the sender's save); returns its handle."""
    import ray

    buf = encode_chunk(chunk)
    ref = ray.put(buf)
    return KVHandle(chunk.request_id, ref, chunk.num_tokens, int(buf.nbytes), chunk.first_token)


async def fetch_kv(handle: KVHandle, timeout_s: float, delay_s: float = 0.0) -> tuple[KVChunk, float]:
    """The receiver's fetch: (its own decoded copy, seconds). ``delay_s`` is fault injection."""
    t0 = time.perf_counter()

    async def get():
        if delay_s:
            await asyncio.sleep(delay_s)
        return await handle.ref

    try:
        buf = await asyncio.wait_for(get(), timeout=timeout_s)
    except asyncio.TimeoutError:
        raise KVTransferError(f"KV fetch timed out after {timeout_s:g}s") from None
    except Exception as e:  # owner died, object lost, ...
        raise KVTransferError(f"KV fetch failed: {type(e).__name__}: {e}") from e
    # The object-store buffer is read-only, so decoding copies every tensor out of it: once `buf`
    # goes, this process pins nothing in the object store.
    chunk = decode_chunk(buf, KVChunk)
    del buf
    if chunk.request_id != handle.request_id or chunk.num_tokens != handle.num_tokens:
        raise KVTransferError(f"KV object is for {chunk.request_id!r} ({chunk.num_tokens} "
                              f"tokens), expected {handle.request_id!r} ({handle.num_tokens})")
    return chunk, time.perf_counter() - t0
