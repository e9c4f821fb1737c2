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

Sampling differences from the transformers runner: vLLM's repetition penalty also covers prompt
tokens (ours covers generated tokens only), and seeded sampling draws from vLLM's generators, so
only greedy decoding gives the same tokens on both backends.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason
from omni_ray.runners.thinker import ThinkerStepOutput

IM_END_TOKEN_ID = 151645  # <|im_end|>: the thinker's end of turn when config.json does not say

# vLLM's CompletionOutput.finish_reason (a string) -> ours.
_FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORT,
}


class VllmThinkerRunner:
    """Step loop over an in-process vLLM engine serving the thinker."""

    def __init__(self, model_dir: str | os.PathLike, *, dtype: str = "float32",
                 max_num_seqs: int = 64, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, enforce_eager: bool = False,
                 eos_token_ids: list[int] | None = None, multiprocessing: bool = False,
                 engine_kwargs: dict | None = None):
        """Start the engine (loads and warms up the model: seconds to a minute on CPU).

        ``gpu_memory_utilization`` is vLLM's (on CPU: the fraction of host memory reserved, unless
        ``engine_kwargs`` sets ``kv_cache_memory_bytes``); the default leaves room for the talker
        and code2wav on the same device. ``engine_kwargs`` go to vLLM's ``EngineArgs`` unchanged
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
            # We send token ids and read token ids: no tokenizer, no detokenizer.
            skip_tokenizer_init=True,
            # Text-only prompts: no encoder profiling or cache for audio / images / video.
            limit_mm_per_prompt={"image": 0, "video": 0, "audio": 0},
            disable_log_stats=True,
        )
        args.update(engine_kwargs or {})
        self.max_num_seqs = args["max_num_seqs"]
        with _no_torch_compile_on_cpu(args["enforce_eager"]):
            self.engine = LLMEngine.from_engine_args(EngineArgs(**args))
        self._prompt_lens: dict[str, int] = {}  # running request id -> prompt length

    # -- request lifecycle -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    max_tokens: int, stop_token_ids: list[int] | None = None) -> None:
        from vllm.inputs import TokensPrompt

        if request_id in self._prompt_lens:
            raise ValueError(f"duplicate request_id {request_id!r}")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        stop = sorted(self.eos_token_ids | frozenset(stop_token_ids or ()))
        self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt_ids)),
                                _vllm_sampling_params(params, max_tokens, stop))
        self._prompt_lens[request_id] = len(prompt_ids)

    def abort(self, request_id: str) -> bool:
        if self._prompt_lens.pop(request_id, None) is None:
            return False
        self.engine.abort_request([request_id])
        return True

    def has_unfinished(self) -> bool:
        return bool(self._prompt_lens)

    @property
    def num_requests(self) -> int:
        return len(self._prompt_lens)

    def request_ids(self) -> list[str]:
        return list(self._prompt_lens)

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[ThinkerStepOutput]:
        outputs = []
        # 1) One engine iteration; DELTA outputs carry only this step's new tokens.
        for out in self.engine.step():
            num_prompt = self._prompt_lens.get(out.request_id)
            if num_prompt is None:  # aborted meanwhile
                continue
            completion = out.outputs[0]
            # 2) Map vLLM's finish reason; a finished request leaves our table.
            reason = FinishReason.NONE
            if out.finished:
                reason = _FINISH_REASONS.get(completion.finish_reason, FinishReason.ERROR)
                del self._prompt_lens[out.request_id]
            outputs.append(ThinkerStepOutput(out.request_id, list(completion.token_ids),
                                             out.finished, reason, num_prompt))
        return outputs

    def shutdown(self) -> None:
        """Abort what is left and stop the engine core (frees its memory and processes)."""
        if self._prompt_lens:
            self.engine.abort_request(list(self._prompt_lens))
            self._prompt_lens.clear()
        self.engine.engine_core.shutdown()


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
        ignore_eos=False,
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
