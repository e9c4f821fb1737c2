"""Thinker runner (vLLM backend): the same step loop as ``ThinkerRunner``, on vLLM's v1 engine.

vLLM serves the thinker of a Qwen3-Omni checkpoint (architecture
``Qwen3OmniMoeForConditionalGeneration``). The runner drives vLLM's synchronous ``LLMEngine``:
``add_request`` queues a token prompt, each ``step()`` runs one engine step (scheduler + one
forward) and returns the tokens it produced per request (one per decoding request; none for a
request whose prompt is still being prefilled in chunks).

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) by default, so one
``step()`` is exactly one engine iteration and nothing runs between steps; with multiprocessing the
engine core runs ahead in a subprocess and a step returns whatever outputs have arrived (possibly
none). vLLM is imported lazily: importing this module does not need vLLM.

An in-process engine changes process-wide state (seen with vLLM 0.26 on CPU): it seeds the global
RNGs (``EngineArgs.seed``, 0), calls ``gc.freeze()`` until ``shutdown()``, and its CPU worker
replaces ``torch.set_num_threads`` with a no-op; choose the thread count before starting it.

Audio / image prompts: vLLM runs the checkpoint's processor and the thinker's encoders itself, so
a request brings the decoded media (``MultiModalInputs.raw_audio`` / ``raw_images``) and the
prompt with its placeholders expanded by our processor; the runner collapses each placeholder run
to one token for vLLM and checks that vLLM's expansion gives the same prompt. The accept-layer
hidden states the talker needs come from a forward hook (``runners/vllm/hidden.py``).

Sampling differences from the transformers runner: vLLM's repetition penalty also covers prompt
tokens (ours covers generated tokens only), and seeded sampling draws from vLLM's generators, so
only greedy decoding gives the same tokens on both backends.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason, MultiModalInputs
from omni_ray.runners.sampling import stop_ids
from omni_ray.runners.transformers.thinker import MMContext, ThinkerStepOutput

if TYPE_CHECKING:
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.serving import StageConfig

IM_END_TOKEN_ID = 151645  # <|im_end|>: the thinker's end of turn when config.json does not say

# vLLM's CompletionOutput.finish_reason (a string) -> ours.
_FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORT,
}


class VllmThinkerRunner:
    """Step loop over an in-process vLLM engine serving the thinker."""

    needs_raw_media = True  # vLLM runs the processor itself: media requests bring decoded media

    @classmethod
    def from_config(cls, model_dir: str | Path, stage_cfg: StageConfig, *,
                    pipeline: PipelineConfig | None = None, kv_transfer: bool = False,
                    max_model_len: int | None = None) -> VllmThinkerRunner:
        """Start the engine as ``stage_cfg`` says: its dtype, ``max_num_seqs`` and
        ``engine_kwargs`` over our CPU defaults and ``max_model_len`` (runners/vllm/engine_args.py).
        ``kv_transfer``: with omni_ray's KV connector (prefill/decode disaggregation)."""
        from omni_ray.runners.vllm.engine_args import engine_kwargs

        return cls(model_dir, dtype=stage_cfg.dtype, max_num_seqs=stage_cfg.max_num_seqs,
                   kv_transfer=kv_transfer,
                   engine_kwargs=engine_kwargs(model_dir, stage_cfg, max_model_len))

    def __init__(self, model_dir: str | os.PathLike, *, dtype: str = "float32",
                 max_num_seqs: int = 64, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, enforce_eager: bool = False,
                 eos_token_ids: list[int] | None = None, multiprocessing: bool = False,
                 accept_hidden_layer: int | None = None, media_per_prompt: int = 4,
                 kv_transfer: bool = False, engine_kwargs: dict | None = None):
        """Start the engine (loads and warms up the model: seconds to a minute on CPU).

        ``gpu_memory_utilization`` is vLLM's (on CPU: the fraction of host memory reserved, unless
        ``engine_kwargs`` sets ``kv_cache_memory_bytes``); the default leaves room for the talker
        and code2wav on the same device. ``media_per_prompt``: audio clips and images a prompt
        may hold (vLLM's ``limit_mm_per_prompt``; 0: text only, no encoder profiling).
        ``accept_hidden_layer`` (default: the checkpoint's talker's): capture the talker's hidden
        states for media prompts (needs the engine in this process; compiled or eager).
        ``kv_transfer``: the prefill/decode hand-off (``prefill_only`` / ``add_prefilled_kv``)
        through omni_ray's KV connector (runners/vllm/kv_connector.py; in-process engine). ``engine_kwargs`` go to vLLM's ``EngineArgs`` unchanged
        and override the arguments above. ``eos_token_ids`` default to the checkpoint's
        ``im_end_token_id``.
        """
        # vLLM reads this when it builds its config (the CPU platform also picks its executor
        # from it), so it is set before the engine exists; it is process-wide.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.model_dir = Path(model_dir)
        self.eos_token_ids = frozenset(eos_token_ids or [_im_end_token_id(self.model_dir)])
        args = dict(
            model=str(self.model_dir), dtype=dtype, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            # We send token ids and read token ids; vLLM's processor needs the tokenizer only
            # for media prompts.
            skip_tokenizer_init=media_per_prompt == 0,
            limit_mm_per_prompt={"image": media_per_prompt, "video": 0,
                                 "audio": media_per_prompt},
            disable_log_stats=True,
        )
        if kv_transfer:
            from vllm.config import KVTransferConfig

            from omni_ray.runners.vllm.kv_connector import CONFIG

            args["kv_transfer_config"] = KVTransferConfig(**CONFIG)
        args.update(engine_kwargs or {})
        config = json.loads((self.model_dir / "config.json").read_text())
        if accept_hidden_layer is None:  # the checkpoint's talker's, if it has a talker
            accept_hidden_layer = config.get("talker_config", {}).get("accept_hidden_layer")
        mm_limits = args["limit_mm_per_prompt"]
        self.media = mm_limits.get("audio", 0) > 0 or mm_limits.get("image", 0) > 0
        capture = self.media and bool(accept_hidden_layer) and not multiprocessing
        if capture:  # the thinker model that copies the talker's rows, compiled or not
            from omni_ray.models.vllm_plugin import THINKER_ARCHITECTURE, register
            from omni_ray.models.vllm_thinker import CAPTURE_LAYER_KEY

            if accept_hidden_layer < 1:
                raise ValueError("accept_hidden_layer must be >= 1 (a decoder layer's output)")
            register()
            args["hf_overrides"] = {**(args.get("hf_overrides") or {}),
                                    "architectures": [THINKER_ARCHITECTURE],
                                    CAPTURE_LAYER_KEY: int(accept_hidden_layer)}
        self.kv_transfer = kv_transfer
        self.max_num_seqs = args["max_num_seqs"]
        from omni_ray.runners.start_phases import StartPhases
        from omni_ray.runners.vllm.kernel_warmup import warm_kernels_on_gpu
        from omni_ray.runners.vllm.process import shared_workspace

        self.start_phases = phases = StartPhases()
        with _no_torch_compile_on_cpu(args["enforce_eager"]), shared_workspace(), \
                phases.timed("vllm_engine_s"):
            self.engine = LLMEngine.from_engine_args(EngineArgs(**args))
        with phases.timed("kernel_warmup_s"):  # prefill shapes' kernels now, not in traffic
            warm_kernels_on_gpu(self.engine, "thinker")
        self._prompt_lens: dict[str, int] = {}  # running request id -> prompt length
        self._first: dict[str, int] = {}  # prefilled elsewhere: the token to emit first
        self._done_early: list[ThinkerStepOutput] = []  # prefilled requests that end at once
        self.time_spent = dict(engine_s=0.0)  # in vLLM's step (the engine's stats)
        self._mm: dict[str, tuple[list[int], MultiModalInputs]] = {}  # until the first output
        th = config["thinker_config"]
        self._mm_ids = {th["audio_token_id"], th["image_token_id"], th["video_token_id"]}
        self._capture = None
        self._no_capture = None  # why media prompts cannot get the talker's hidden states
        if capture:
            from omni_ray.runners.vllm.hidden import MMHiddenCapture

            self._capture = MMHiddenCapture(self.engine)
        elif self.media and accept_hidden_layer:
            self._no_capture = "the vLLM engine core runs in another process"

    # -- request lifecycle -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    max_tokens: int, stop_token_ids: list[int] | None = None,
                    mm: MultiModalInputs | None = None) -> None:
        from vllm.inputs import TokensPrompt

        if request_id in self._prompt_lens:
            raise ValueError(f"duplicate request_id {request_id!r}")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        stop = sorted(stop_ids(params, self.eos_token_ids, stop_token_ids))
        sampling = _vllm_sampling_params(params, max_tokens, stop)
        if mm is None:
            prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        else:
            prompt = self._media_prompt(request_id, prompt_ids, mm)
            sampling.skip_reading_prefix_cache = True  # every prompt row must run (the hook)
        try:
            self.engine.add_request(request_id, prompt, sampling)
        except BaseException:
            self._forget(request_id)
            raise
        self._prompt_lens[request_id] = len(prompt_ids)

    def _media_prompt(self, request_id: str, prompt_ids: list[int], mm: MultiModalInputs):
        """vLLM's prompt for a media request: one placeholder token per clip / image (vLLM
        expands them itself) and the decoded media."""
        from PIL import Image
        from vllm.inputs import TokensPrompt

        if not self.media:
            raise ValueError("audio/image input is off for this vLLM thinker (media_per_prompt=0)")
        if self._no_capture:
            raise ValueError(f"audio/image input is unavailable: {self._no_capture}")
        if mm.raw_audio is None and mm.num_audios or mm.raw_images is None and mm.num_images:
            raise ValueError("a vLLM thinker needs the decoded media (raw_audio / raw_images)")
        collapsed = [t for i, t in enumerate(prompt_ids)
                     if not (t in self._mm_ids and i > 0 and prompt_ids[i - 1] == t)]
        data = {}
        if mm.raw_audio:
            data["audio"] = [(a, 16000) for a in mm.raw_audio]
        if mm.raw_images:
            data["image"] = [Image.fromarray(im) for im in mm.raw_images]
        self._mm[request_id] = (list(prompt_ids), mm)
        if self._capture is not None:
            self._capture.register(request_id, [i for i, t in enumerate(prompt_ids)
                                                if t in self._mm_ids])
        return TokensPrompt(prompt_token_ids=collapsed, multi_modal_data=data)

    # -- prefill/decode disaggregation (kv_transfer=True) -------------------------------------
    def prefill_only(self, prompt_ids: list[int], params: SamplingParams):
        """Run the prompt and sample its first token; its KV comes back in the portable layout
        (``Prefilled.cache``). Steps the engine until done: meant for a prefill-only engine."""
        import uuid

        from omni_ray.runners.kv import Prefilled
        from omni_ray.runners.vllm.kv_connector import SAVED

        if not self.kv_transfer:
            raise RuntimeError("this vLLM thinker was started without kv_transfer")
        rid = f"prefill-{uuid.uuid4().hex}"
        sampling = _vllm_sampling_params(params, 1, sorted(stop_ids(params, self.eos_token_ids)))
        sampling.extra_args = {"kv_transfer_params": {"omni_ray": "save", "key": rid}}
        self.engine.add_request(rid, TokensPromptOf(prompt_ids), sampling)
        token = None
        try:
            while token is None:
                for out in self.engine.step():
                    if out.request_id == rid and out.outputs[0].token_ids:
                        token = int(out.outputs[0].token_ids[0])
            kv = SAVED.pop(rid)
        except BaseException:
            self.engine.abort_request([rid])
            SAVED.pop(rid, None)
            raise
        return Prefilled(token, kv, len(prompt_ids), None, 0)

    @staticmethod
    def extract_kv(pre) -> "torch.Tensor":
        """The portable KV of a ``prefill_only`` result (already extracted by the connector)."""
        return pre.cache

    def add_prefilled_kv(self, request_id: str, prompt_ids: list[int], first_token: int, kv,
                         params: SamplingParams, max_tokens: int,
                         stop_token_ids: list[int] | None = None, *, rng_state=None,
                         rope_delta: int = 0) -> None:
        """Register a request whose prompt KV (``kv``, portable layout) and first token came from
        a prefill elsewhere: vLLM loads the KV, computes only the first token's row, and the
        request's first step emits ``first_token``. (A seeded sampler restarts: ``rng_state`` is
        not carried into vLLM.)"""
        from omni_ray.runners.vllm.kv_connector import TO_LOAD

        if not self.kv_transfer:
            raise RuntimeError("this vLLM thinker was started without kv_transfer")
        if request_id in self._prompt_lens:
            raise ValueError(f"duplicate request_id {request_id!r}")
        if kv.shape[3] != len(prompt_ids):
            raise ValueError(f"KV holds {kv.shape[3]} tokens, the prompt has {len(prompt_ids)}")
        stop = sorted(stop_ids(params, self.eos_token_ids, stop_token_ids))
        if first_token in stop or max_tokens <= 1:  # ends with its first token: no engine work
            reason = FinishReason.STOP if first_token in stop else FinishReason.LENGTH
            self._done_early.append(ThinkerStepOutput(request_id, [first_token], True, reason,
                                                      len(prompt_ids)))
            self._prompt_lens[request_id] = len(prompt_ids)
            return
        sampling = _vllm_sampling_params(params, max_tokens - 1, stop)
        sampling.extra_args = {"kv_transfer_params": {
            "omni_ray": "load", "key": request_id, "num_tokens": len(prompt_ids)}}
        TO_LOAD[request_id] = kv
        try:
            self.engine.add_request(request_id, TokensPromptOf(list(prompt_ids) + [first_token]),
                                    sampling)
        except BaseException:
            TO_LOAD.pop(request_id, None)
            raise
        self._prompt_lens[request_id] = len(prompt_ids)
        self._first[request_id] = first_token

    def _forget(self, request_id: str) -> None:
        self._first.pop(request_id, None)
        self._done_early = [o for o in self._done_early if o.request_id != request_id]
        if self.kv_transfer:
            from omni_ray.runners.vllm.kv_connector import TO_LOAD

            TO_LOAD.pop(request_id, None)
        self._mm.pop(request_id, None)
        if self._capture is not None:
            self._capture.forget(request_id)

    def abort(self, request_id: str) -> bool:
        self._forget(request_id)
        if self._prompt_lens.pop(request_id, None) is None:
            return False
        self.engine.abort_request([request_id])
        return True

    def has_unfinished(self) -> bool:
        return bool(self._prompt_lens)

    @property
    def num_requests(self) -> int:
        """Running requests, plus any KV the connector still stages for none (a leak: the
        Serve tests' clean-state checks see it here)."""
        staged = set()
        if self.kv_transfer:
            from omni_ray.runners.vllm.kv_connector import SAVED, TO_LOAD

            staged = (set(TO_LOAD) | set(SAVED)) - set(self._prompt_lens)
        return len(self._prompt_lens) + len(staged)

    def request_ids(self) -> list[str]:
        return list(self._prompt_lens)

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[ThinkerStepOutput]:
        outputs, self._done_early = self._done_early, []
        for o in outputs:
            del self._prompt_lens[o.request_id]
        # 1) One engine iteration; DELTA outputs carry only this step's new tokens.
        t0 = time.perf_counter()
        step_outputs = self.engine.step()
        self.time_spent["engine_s"] += time.perf_counter() - t0
        for out in step_outputs:
            num_prompt = self._prompt_lens.get(out.request_id)
            if num_prompt is None:  # aborted meanwhile
                continue
            completion = out.outputs[0]
            # 2) A media request's first output: vLLM's prompt must be ours; hand out the
            #    hidden states the talker needs.
            mm_ctx = None
            if out.request_id in self._mm:
                try:
                    mm_ctx = self._mm_context(out)
                except Exception as e:  # this request only
                    self.abort(out.request_id)
                    outputs.append(ThinkerStepOutput(out.request_id, [], True, FinishReason.ERROR,
                                                     num_prompt, f"{type(e).__name__}: {e}"))
                    continue
            # 3) Map vLLM's finish reason; a finished request leaves our table.
            reason = FinishReason.NONE
            if out.finished:
                reason = _FINISH_REASONS.get(completion.finish_reason, FinishReason.ERROR)
                del self._prompt_lens[out.request_id]
            tokens = list(completion.token_ids)
            first = self._first.pop(out.request_id, None)
            if first is not None:  # prefilled elsewhere: its first token leads
                tokens.insert(0, first)
            outputs.append(ThinkerStepOutput(out.request_id, tokens, out.finished, reason,
                                             num_prompt, mm=mm_ctx))
        return outputs

    def _mm_context(self, out) -> MMContext | None:
        ids, mm = self._mm.pop(out.request_id)
        if list(out.prompt_token_ids or []) != ids:
            raise ValueError("vLLM expanded the media placeholders differently from the "
                             "checkpoint's processor")
        if self._capture is None:
            return None
        return MMContext(self._capture.take(out.request_id), mm.image_grid_thw,
                         mm.audio_feature_lengths())

    def shutdown(self) -> None:
        """Abort what is left and stop the engine core (frees its memory and processes)."""
        if self._prompt_lens:
            self.engine.abort_request(list(self._prompt_lens))
            self._prompt_lens.clear()
        if self._capture is not None:
            self._capture.close()
        self._mm.clear()
        self.engine.engine_core.shutdown()


def TokensPromptOf(ids: list[int]):  # noqa: N802 - vLLM's prompt type, built lazily
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(ids))


def _vllm_sampling_params(params: SamplingParams, max_tokens: int, stop_token_ids: list[int]):
    """Our ``SamplingParams`` -> vLLM's (token ids out, one delta per step)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(
        temperature=params.temperature,  # 0 is greedy in vLLM too
        top_k=params.top_k,              # 0 disables top-k in vLLM too
        top_p=params.top_p,
        repetition_penalty=params.repetition_penalty,
        seed=None if params.greedy else params.seed,
        max_tokens=max_tokens,
        # Without a tokenizer vLLM knows no eos, so the end-of-turn ids are stop tokens; the stop
        # token is part of the output, as in the transformers runner.
        stop_token_ids=stop_token_ids,
        ignore_eos=params.ignore_eos,  # vLLM's own eos (the tokenizer's, where it has one)
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


@contextlib.contextmanager
def _no_torch_compile_on_cpu(enforce_eager: bool):
    """On CPU with ``enforce_eager``, keep vLLM's sampler eager too (dynamo off while it starts).

    vLLM's CPU sampler ``torch.compile``s its random draw (``compiled_random_sample`` in
    ``vllm/v1/sample/ops/topk_topp_sampler.py``) even with ``enforce_eager``; the warm-up's
    inductor C++ build was most of a 20-50 s engine start here, and ~2-5 s remain without it
    (seen, 2 loaded cores). Dynamo then skips that function for good: unseeded random sampling
    stays eager (~20 ms instead of ~7 ms for 4 x 152k logits, seen); greedy and seeded sampling
    never use it. Only this process is affected (not a multiprocessing engine core).
    """
    from vllm.platforms import current_platform

    if not (enforce_eager and current_platform.is_cpu()):
        yield
        return
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


def _im_end_token_id(model_dir: Path) -> int:
    config = model_dir / "config.json"
    if not config.exists():
        return IM_END_TOKEN_ID
    return int(json.loads(config.read_text()).get("im_end_token_id", IM_END_TOKEN_ID))
