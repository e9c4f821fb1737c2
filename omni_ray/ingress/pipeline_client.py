"""Route one request through the stage deployments and merge their output streams.

The ingress owns the request's lifecycle: it opens the stages from the last to the first (each
``open`` returns the replica's engine handle, which the upstream stage pushes chunks to), merges
the thinker's text and code2wav's audio into one stream, and on any error, cancel or client
disconnect cancels every stage call, which aborts the request in each engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from omni_ray.config.request import OmniRequest
from omni_ray.payload import decode_chunk

_DONE = object()


class StageError(Exception):
    """A stage failed this request (the message names the stage)."""


class PipelineClient:
    def __init__(self, thinker, talker, code2wav):
        self.thinker, self.talker, self.code2wav = thinker, talker, code2wav

    async def run(self, req: OmniRequest) -> AsyncIterator[object]:
        """Yield ``TextDelta`` and ``AudioChunk`` items as the stages produce them."""
        gens, tasks = [], []
        try:
            downstream = None
            if req.wants_audio:
                c2w = self.code2wav.options(stream=True).open.remote(req, None)
                gens.append(("code2wav", c2w))
                c2w_engine = await _first(c2w, "code2wav")
                tk = self.talker.options(stream=True).open.remote(req, c2w_engine)
                gens.append(("talker", tk))
                downstream = await _first(tk, "talker")
            th = self.thinker.options(stream=True).open.remote(req, downstream)
            gens.append(("thinker", th))
            await _first(th, "thinker")
            queue: asyncio.Queue = asyncio.Queue()
            tasks = [asyncio.create_task(_pump(name, g, queue)) for name, g in gens]
            remaining = len(tasks)
            while remaining:
                name, item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise StageError(f"{name}: {item}") from item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()
            for _, g in gens:
                g.cancel()


async def _first(gen, name: str):
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        raise StageError(f"{name}: stream ended before it started") from None
    except ValueError:
        raise
    except Exception as e:  # a replica's ValueError arrives wrapped: keep it a ValueError
        cause = _root(e)
        if isinstance(cause, ValueError):
            raise ValueError(str(cause)) from e
        raise StageError(f"{name}: {cause}") from e


async def _pump(name: str, gen, queue: asyncio.Queue) -> None:
    try:
        async for buf in gen:
            await queue.put((name, decode_chunk(buf)))
        await queue.put((name, _DONE))
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        await queue.put((name, _root(e)))


def _root(e: BaseException) -> BaseException:
    """Unwrap Ray's task errors to the exception the stage raised."""
    cause = getattr(e, "cause", None)
    while cause is not None and cause is not e:
        e, cause = cause, getattr(cause, "cause", None)
    return e
