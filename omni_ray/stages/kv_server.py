"""Serve deployments of a disaggregated thinker: ``ThinkerPrefill`` and ``ThinkerDecode``.

``ThinkerPrefillServer.prefill(request, kv_fault=None)`` is a streaming method: it yields the
sender's ``KVProgress`` items, HELD (the prompt ran; ``first_token``) and then EXTRACTED (the save
is done and the sender's cache freed; ``handle`` holds the object-store ref), and ends. Any
failure raises from the stream; the sender has freed (or will free, right after its own save) its
cache either way. Cancelling the call does not stop the sender's save; it frees itself after.

``ThinkerDecodeServer`` is a thinker deployment (``open`` as in ``stages/server.py``) whose
``open(request, downstream, expect_kv=True)`` registers the request without running its prompt;
the ingress then calls ``fetch_kv`` and ``load_kv`` on the engine handle that ``open`` yielded.
"""

from __future__ import annotations

from omni_ray.config.request import OmniRequest
from omni_ray.config.serving import OmniServingArgs
from omni_ray.pipeline.emit import StageRequestError
from omni_ray.stages.server import StageServer
from omni_ray.testing import faults


class ThinkerPrefillServer(StageServer):
    stage = "thinker_prefill"

    @classmethod
    def stage_config(cls, args: OmniServingArgs):
        return args.thinker_disaggregation.prefill

    def engine_spec(self, args: OmniServingArgs) -> tuple[type, dict]:
        from omni_ray.stages.kv_engine import PrefillEngine

        return PrefillEngine, {}

    async def prefill(self, request: OmniRequest, kv_fault: str | None = None):
        from ray.exceptions import ActorDiedError, RayActorError

        engine = self.sup.engine_for_request()  # EngineUnavailable: nothing started yet
        try:
            gen = engine.prefill.options(num_returns="streaming").remote(request, kv_fault)
            async for ref in gen:
                ev = await ref
                if kv_fault is not None:  # tests only (omni_ray/testing/faults.py)
                    faults.kill_sender(kv_fault, ev.state, engine)
                yield ev
        except RayActorError as e:
            if isinstance(e, ActorDiedError):
                self.sup.report_death(engine, type(e).__name__)  # a new engine starts
            raise StageRequestError(f"{self.stage} engine died ({type(e).__name__})") from None

    async def open(self, request: OmniRequest, downstream=None, **kw):
        raise TypeError(f"{self.stage} does not stream requests; call prefill()")
        yield  # pragma: no cover  (makes this an async generator like the others)


class ThinkerDecodeServer(StageServer):
    stage = "thinker_decode"

    @classmethod
    def stage_config(cls, args: OmniServingArgs):
        return args.thinker_disaggregation.decode

    def engine_spec(self, args: OmniServingArgs) -> tuple[type, dict]:
        from omni_ray.stages.kv_engine import DecodeEngine

        return DecodeEngine, {"timeouts": args.thinker_disaggregation.timeouts}


KV_STAGE_SERVERS = {"thinker_prefill": ThinkerPrefillServer, "thinker_decode": ThinkerDecodeServer}
