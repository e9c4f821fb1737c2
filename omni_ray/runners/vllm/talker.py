"""Talker runner (vLLM backend): the talker's backbone batched in vLLM, the rest as in transformers.

Same interface and same outputs as ``TalkerRunner``. vLLM runs the talker's Qwen3-MoE backbone and
codec head (``omni_ray.models.vllm_talker``, registered through omni_ray's vLLM plugin) over all
running requests at once, with paged KV; the inputs each step needs (prefill embeddings, the code
predictor's 15 codebooks, the thinker's next text) are built by ``TalkerInputs`` from transformers'
modules, exactly as for the transformers backbone, and handed to vLLM through ``_Bridge``:

* prefill: ``EmbedsPrompt`` (the user turns + 9 assistant positions), once the first text token
  is known;
* decode: vLLM asks the model for the embeddings of each token-id row (the codebook-0 code it
  sampled last step); the bridge maps rows to requests, takes the frame's 15 other codebooks
  from the code predictor, adds the projected text for this step, and keeps the frame for this
  runner to emit. With the batched code predictor (the default) it already ran right behind
  last step's sampler, on CUDA on a stream of its own (``_Bridge.after_sampling``, a wrap of
  the model runner's ``sampler``), while the CPU finished that step and prepared this one;
* waiting: ``TalkerScheduler`` does not schedule a request whose next text is unknown. If one is
  ever scheduled anyway, the bridge fails that request loudly instead of decoding on nothing.

vLLM internals the bridge reads (vLLM 0.26; checked when the engine starts, and the parity tests in
tests/vllm fail if their meaning moves): the engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); ``model_executor.driver_worker.worker.model_runner`` with
``input_batch.req_ids`` / ``num_reqs`` (row order of the step's requests, vLLM's internal ids as
``add_request`` returns them), ``query_start_loc.np`` (each request's rows), ``is_token_ids.np``
(rows fed by token id, not by prompt embedding) and ``input_ids.np`` (the ids fed, on the
host); ``engine_core.engine_core.scheduler``; ``compute_logits`` receiving one hidden row per
request in ``req_ids`` order; the model runner's ``sampler`` (called once per step with the
rows' logits, returning ``sampled_token_ids``) and ``discard_request_mask`` (rows whose
sample is thrown away: a prompt still being prefilled).

Async scheduling (``engine_kwargs: {async_scheduling: true}``, off by default): vLLM schedules
and prepares step k+1 while the device runs step k, and the host learns step k's codes a step
later. The bridge then never reads a sampled code on the host: a decode row's input is the
code predictor's result behind the sampler (``early``, required), the repetition penalty marks
the codes the sampler hook saw (on the device), and a frame whose first code is the codec end
is no frame (vLLM runs one step past a stop before it reads it). vLLM's CPU platform turns async
scheduling off; a talker that asks for it keeps it there, so its CPU tests check it.

Multimodal prompts: the talker's 3-D (mrope) positions come from transformers' ``get_rope_index``
(``TalkerInputs.mm_positions``) and reach vLLM through a wrapper on the model runner's
``_init_mrope_positions`` (one more internal); text-only prompts use the model's equal rows. The
code predictor runs in PyTorch (CUDA graphs on GPU), not in vLLM's forward.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from omni_ray.config.sampling import SamplingParams
from omni_ray.payload import FinishReason
from omni_ray.runners.transformers.talker_inputs import (TalkerInputs, TalkerRequests, TalkerSeq,
                                                       TalkerStepOutput, to_device)

if TYPE_CHECKING:
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.serving import StageConfig

logger = logging.getLogger(__name__)
_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH,
                   "abort": FinishReason.ABORT}


class VllmTalkerRunner(TalkerRequests):
    """Step loop over an in-process vLLM engine serving the talker's backbone."""

    @classmethod
    def from_config(cls, model_dir: str | Path, stage_cfg: StageConfig, *,
                    pipeline: PipelineConfig | None = None, kv_transfer: bool = False,
                    max_model_len: int | None = None) -> VllmTalkerRunner:
        """Load the talker's transformers parts and start the backbone's engine as ``stage_cfg``
        says (``engine_kwargs`` over our CPU defaults with a 256 MiB KV cache, and
        ``max_model_len``); ``pipeline`` and ``kv_transfer`` do not apply to it."""
        from omni_ray.models.loading import load_stage
        from omni_ray.runners.vllm.engine_args import CPU_ENGINE_DEFAULTS, engine_kwargs

        tk = load_stage(model_dir, "talker", stage_cfg.device, getattr(torch, stage_cfg.dtype))
        kwargs = engine_kwargs(model_dir, stage_cfg, max_model_len,
                               cpu_defaults={**CPU_ENGINE_DEFAULTS,
                                             "kv_cache_memory_bytes": 256 << 20})
        return cls(model_dir, tk.module, tk.text_embedding, tk.config, dtype=stage_cfg.dtype,
                   device=stage_cfg.device, max_num_seqs=stage_cfg.max_num_seqs,
                   engine_kwargs=kwargs, compile_graphs=stage_cfg.compile_graphs,
                   fused_code_predictor=stage_cfg.fused_code_predictor,
                   early_code_predictor=stage_cfg.early_code_predictor)

    def __init__(self, model_dir: str | os.PathLike, talker, text_embedding, config, *,
                 dtype: str = "float32", device: str = "cpu", max_num_seqs: int = 64,
                 max_model_len: int = 4096, gpu_memory_utilization: float = 0.2,
                 enforce_eager: bool = False, batch_code_predictor: bool = True,
                 engine_kwargs: dict | None = None, compile_graphs: bool = False,
                 fused_code_predictor: bool = False, early_code_predictor: bool = True):
        """``talker`` / ``text_embedding`` / ``config``: transformers' talker module (its backbone
        layers are dropped here: vLLM holds its own copy), the thinker's token embedding table and
        the checkpoint's ``Qwen3OmniMoeConfig``, as ``load_stage(model_dir, "talker")`` gives
        them. ``engine_kwargs`` go to vLLM's ``EngineArgs`` and override the rest (e.g.
        ``load_format: dummy`` for random weights). ``early_code_predictor`` (with the batched
        code predictor): it runs right behind vLLM's sampler, not in the next step's input
        (``_Bridge.after_sampling``)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the bridge lives in this process
        from vllm.engine.arg_utils import EngineArgs

        from omni_ray.runners.start_phases import StartPhases
        from vllm.v1.engine.llm_engine import LLMEngine

        from omni_ray.models.vllm_plugin import register
        from omni_ray.models.vllm_talker import AsyncTalkerScheduler, TalkerScheduler
        from omni_ray.runners.vllm.thinker import _no_torch_compile_on_cpu

        register()
        self.start_phases = phases = StartPhases()
        talker.model.layers = torch.nn.ModuleList()  # vLLM runs the backbone
        self.cfg = config
        self.device = device
        self.inputs = TalkerInputs(talker, text_embedding, config, device,
                                   compile_graphs=compile_graphs,
                                   fused_code_predictor=fused_code_predictor)
        self.num_code_groups = self.inputs.num_code_groups
        self.max_num_seqs = max_num_seqs
        from omni_ray.runners.vllm.talker_backbone import backbone_dir

        # the same directory on every start from this checkpoint: vLLM's compile cache (and the
        # code predictor's, in the inductor cache vLLM points this process at) hit
        self.backbone_dir = backbone_dir(model_dir)
        batch = batch_code_predictor and self.inputs.can_batch
        args = dict(
            model=str(self.backbone_dir), dtype=dtype, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager, skip_tokenizer_init=True, enable_prompt_embeds=True,
            enable_prefix_caching=False, async_scheduling=False, scheduler_cls=TalkerScheduler,
            generation_config="vllm", disable_log_stats=True,
        )
        args.update(engine_kwargs or {})
        self.async_step = bool(args["async_scheduling"])
        if self.async_step:
            if not (batch and early_code_predictor):
                raise ValueError("talker async_scheduling needs the batched code predictor "
                                 "behind the sampler (early_code_predictor, a batchable "
                                 "code predictor)")
            args["scheduler_cls"] = AsyncTalkerScheduler
        from omni_ray.runners.vllm.process import shared_workspace

        with _no_torch_compile_on_cpu(args["enforce_eager"]), shared_workspace(), \
                _async_scheduling_kept(self.async_step), phases.timed("vllm_engine_s"):
            self.engine = LLMEngine.from_engine_args(EngineArgs(**args))
        if self.engine.vllm_config.scheduler_config.async_scheduling != self.async_step:
            raise RuntimeError(f"vLLM did not keep the talker's async_scheduling="
                               f"{self.async_step}")
        self._dtype = getattr(torch, args["dtype"]) if isinstance(args["dtype"], str) else None
        try:
            core = self.engine.engine_core.engine_core
            model_runner = self.engine.model_executor.driver_worker.worker.model_runner
            model = model_runner.get_model()
            scheduler = core.scheduler
            for name in ("input_batch", "query_start_loc", "is_token_ids", "input_ids",
                         "sampler", "discard_request_mask"):
                getattr(model_runner, name)
        except AttributeError as e:
            raise RuntimeError("vLLM internals the talker bridge relies on have moved "
                               f"({e}); see omni_ray/runners/vllm/talker.py") from e
        if not isinstance(scheduler, TalkerScheduler) or not hasattr(model, "omni_bridge"):
            raise RuntimeError("vLLM did not use omni_ray's talker model / scheduler")
        # Seconds per part of the step loop (the engine's stats; benchmarks diff them):
        # admit = prefill inputs + add_request (admit_copy: of it, their one copy to the host,
        # which waits for the GPU); engine = vLLM's step (it includes the bridge's
        # code_predictor, text and logits hooks, counted there too); rest = after the step;
        # sched_*: what vLLM's scheduler gave the steps (models/vllm_talker.TalkerScheduler).
        self.time_spent = dict(admit_s=0.0, admit_copy_s=0.0, engine_s=0.0, code_predictor_s=0.0,
                               text_s=0.0, logits_s=0.0, rest_s=0.0, prefills=0, frames=0,
                               early_frames=0, sched_tokens=0, sched_prompt_tokens=0,
                               sched_new=0, sched_held=0, sched_waiting=0)
        self._bridge = _Bridge(self.inputs, model_runner, batch, self.time_spent,
                               async_step=self.async_step)
        model.omni_bridge = self._bridge
        if batch and early_code_predictor:
            model_runner.sampler = _AfterSampling(model_runner.sampler, self._bridge)
        scheduler.omni_ready = self._bridge.ready
        scheduler.omni_counts = self.time_spent  # sched_*: what each step scheduled
        self._positions_hook(model_runner)
        from omni_ray.runners.vllm.kernel_warmup import warm_kernels_on_gpu

        with phases.timed("kernel_warmup_s"):  # prefill shapes' kernels now, not in traffic
            warm_kernels_on_gpu(self.engine, "talker")
        self._seqs: dict[str, TalkerSeq] = {}
        self._internal: dict[str, str] = {}  # our request id -> vLLM's, once added to vLLM

    def warm_up(self) -> None:
        """The code predictor's compiled CUDA graphs, captured now (``make_runner`` calls this;
        the Serve engine after its GPU start turn, so another engine starts meanwhile: they only
        add to this process's memory, vLLM's engine is built: stages/gpu_start.py)."""
        with self.start_phases.timed("code_predictor_warmup_s"):
            parts = self.inputs.warm_up(self.max_num_seqs)
        self.start_phases.update(parts)  # of code_predictor_warmup: runs, captures

    # -- request lifecycle -------------------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        seq = self._seqs.pop(request_id, None)
        internal = self._internal.pop(request_id, None)
        self._bridge.early.pop(request_id, None)
        self._bridge.unmarked.pop(request_id, None)
        if internal is not None:
            self._bridge.seqs.pop(internal, None)
            self._bridge.positions.pop(internal, None)
            self.engine.abort_request([request_id])
        return seq is not None

    # -- the step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[TalkerStepOutput]:
        spent, t0 = self.time_spent, time.perf_counter()
        outputs = self._admit()
        t1 = time.perf_counter()
        spent["admit_s"] += t1 - t0
        if not self._internal:
            return outputs
        finished: dict[str, FinishReason] = {}
        # vLLM's stream runs nothing of this step before the code predictor's last run ends (on
        # the GPU: the CPU goes on); a step without decode rows may overwrite what it read
        self._bridge.join_side_stream()
        step_outputs = self.engine.step()
        self.inputs.frames_copied()  # the bridge's frames reached the host (long since, by now)
        self._bridge.frames_copied()
        t0 = time.perf_counter()
        spent["engine_s"] += t0 - t1
        for out in step_outputs:
            seq = self._seqs.get(out.request_id)
            if seq is None:  # aborted meanwhile
                continue
            completion = out.outputs[0]
            seq.codec_ids.extend(int(t) for t in completion.token_ids)
            if out.finished:
                finished[out.request_id] = _FINISH_REASONS.get(completion.finish_reason,
                                                               FinishReason.ERROR)
        first = self._bridge.first_frames(finished)
        for rid, seq in list(self._seqs.items()):
            frame = self._bridge.frames.pop(rid, None)
            if frame is not None and int(frame[0, 0]) == self.inputs.codec_eos:
                frame = None  # async: the step vLLM ran past the codec end before it read it
                self.time_spent["frames"] -= 1
            if rid in first:
                frame = first[rid]
            error = self._bridge.errors.pop(rid, None)
            if frame is None and error is None and rid not in finished:
                continue
            frames = frame if frame is not None else torch.empty((0, self.num_code_groups),
                                                                 dtype=torch.long)
            if error is not None:
                self.abort(rid)
                outputs.append(TalkerStepOutput(rid, frames, True, FinishReason.ERROR, error))
                continue
            reason = finished.get(rid, FinishReason.NONE)
            if reason != FinishReason.NONE:
                self._forget(rid)
            outputs.append(TalkerStepOutput(rid, frames, reason != FinishReason.NONE, reason))
        spent["rest_s"] += time.perf_counter() - t0
        return outputs

    def _admit(self) -> list[TalkerStepOutput]:
        """Add the requests whose prefill input is complete to vLLM (one prefill each). Their
        embeddings are built on the device first and reach the host in one copy: one wait for
        the GPU per step, not one per request (a burst admits dozens at once)."""
        from vllm.inputs import EmbedsPrompt

        errors, built = [], []
        room = self.max_num_seqs - len(self._internal)
        for rid, seq in list(self._seqs.items()):
            if len(built) >= room:
                break
            if rid in self._internal or not seq.ready():
                continue
            try:
                embeds, assistant_len = self.inputs.prefill_embeds(seq)
                rope = self.inputs.mm_positions(seq, assistant_len)  # [3, 1, L] or None
            except Exception as e:  # this request only
                errors.append(self._refuse(rid, e))
                continue
            built.append((rid, seq, embeds[0], rope))
        if not built:
            return errors
        t0 = time.perf_counter()
        host = torch.cat([e for _, _, e, _ in built]).to("cpu", self._dtype)
        self.time_spent["admit_copy_s"] += time.perf_counter() - t0
        for (rid, seq, _, rope), embeds in zip(built, host.split([len(b[2]) for b in built])):
            try:
                internal = self.engine.add_request(
                    rid, EmbedsPrompt(prompt_embeds=embeds),
                    _vllm_sampling_params(seq.params, seq.max_frames + 1,
                                          self.inputs.codec_eos))
            except Exception as e:  # this request only
                errors.append(self._refuse(rid, e))
                continue
            seq.prefilled = True
            self.time_spent["prefills"] += 1
            self._internal[rid] = internal
            self._bridge.seqs[internal] = seq
            if rope is not None:  # vLLM's runner takes them when the request joins a batch
                self._bridge.positions[internal] = (rope[:, 0].to("cpu"), seq.rope_delta)
        return errors

    def _refuse(self, rid: str, e: Exception) -> TalkerStepOutput:
        """A request whose prefill could not be admitted: dropped, its error output."""
        del self._seqs[rid]
        return TalkerStepOutput(rid, torch.empty((0, self.num_code_groups), dtype=torch.long),
                                True, FinishReason.ERROR, f"{type(e).__name__}: {e}")

    def _positions_hook(self, model_runner) -> None:
        """A multimodal request's 3-D positions (and decode offset) are ours, not the model's
        text-only default: wrap the model runner's ``_init_mrope_positions`` (called once per
        new request, with its ``req_id``) to take them from the bridge."""
        original = getattr(model_runner, "_init_mrope_positions", None)
        if original is None:
            raise RuntimeError("vLLM internals the talker relies on have moved "
                               "(GPUModelRunner._init_mrope_positions)")
        positions = self._bridge.positions

        def init_mrope_positions(req_state):
            given = positions.pop(req_state.req_id, None)
            if given is None:
                return original(req_state)
            req_state.mrope_positions, req_state.mrope_position_delta = given

        model_runner._init_mrope_positions = init_mrope_positions

    def _forget(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)
        self._bridge.early.pop(request_id, None)
        self._bridge.unmarked.pop(request_id, None)
        internal = self._internal.pop(request_id, None)
        if internal is not None:
            self._bridge.seqs.pop(internal, None)
            self._bridge.positions.pop(internal, None)

    def shutdown(self) -> None:
        """Abort what is left and stop the engine core."""
        for rid in list(self._seqs):
            self.abort(rid)
        self.engine.engine_core.shutdown()


class _Bridge:
    """Per-step inputs for vLLM's talker model; its hooks run inside ``engine.step()``."""

    def __init__(self, inputs: TalkerInputs, model_runner, batch_code_predictor: bool,
                 time_spent: dict, async_step: bool = False):
        self.inputs = inputs
        self.async_step = async_step  # vLLM's async scheduling: no sampled code on the host
        self.spent = time_spent
        self.runner = model_runner
        self.batch_code_predictor = batch_code_predictor
        self.seqs: dict[str, TalkerSeq] = {}      # vLLM's request id -> state
        self.frames: dict[str, torch.Tensor] = {}  # our request id -> frame made this step
        self.errors: dict[str, str] = {}           # our request id -> why it failed this step
        self.positions: dict[str, tuple] = {}      # vLLM's request id -> (mrope [3, L], delta)
        # our request id -> the code predictor's result for the code vLLM sampled last
        # (after_sampling), for the request's next step
        self.early: dict[str, _Early] = {}
        # async step: our request id -> codes sampled since the penalty last marked them, on
        # the device (the host learns them a step late)
        self.unmarked: dict[str, list[torch.Tensor]] = {}
        self._emitted: list = []  # copy events of the early frames this step emits
        self._fresh = 0  # rows whose hidden state on_logits took this step
        self._stream = None   # CUDA: the code predictor's stream behind the sampler
        self._cp_done = None  # CUDA: event after its last run there
        self._sampler_hook: _AfterSampling | None = None
        self._suppress = None
        self._unseen = None  # the penalty's all-False row (requests without a penalty)
        self._dtype = inputs.tts_pad.dtype  # the code predictor's (vLLM's may differ on CPU)

    def ready(self, request) -> bool:
        """Scheduler predicate: may ``request`` run this step?"""
        seq = self.seqs.get(request.request_id)
        if seq is None or request.num_computed_tokens < request.num_prompt_tokens:
            return True  # not ours, or still in its prefill
        return seq.ready() or seq.request_id in self.errors

    def _rows(self) -> tuple[list[tuple[int, str]], list[int]]:
        """(request index, vLLM request id) of each token-id row of this step, in row order, and
        the token ids vLLM feeds them, read from its host copy (with async scheduling off, the
        ids it sent to the GPU): reading the device's would wait for the GPU, which by now is
        running the code predictor behind last step's sampler."""
        batch = self.runner.input_batch
        n = batch.num_reqs
        starts = self.runner.query_start_loc.np[:n + 1]
        total = int(starts[n]) if n else 0
        is_token = self.runner.is_token_ids.np[:total].astype(bool)
        rows = []
        for i, internal in enumerate(batch.req_ids[:n]):
            rows += [(i, internal)] * int(is_token[int(starts[i]):int(starts[i + 1])].sum())
        return rows, self.runner.input_ids.np[:total][is_token].tolist()

    def decode_embeds(self, input_ids: torch.Tensor, embed_codes) -> torch.Tensor:
        """[rows, D] inputs for the token-id rows: frame k-1's summed codebook embeddings plus
        the projected text of step k; runs the code predictor and keeps frame k-1."""
        rows, ids = self._rows()
        if not rows:  # warm-up / profiling: no requests of ours
            return embed_codes(input_ids)
        if len(rows) != input_ids.shape[0]:
            raise RuntimeError(f"talker bridge: {input_ids.shape[0]} token rows, the batch "
                               f"layout says {len(rows)} (vLLM internals moved?)")
        live, row_of = [], {}
        for r, ((_, internal), token) in enumerate(zip(rows, ids)):
            seq = self.seqs.get(internal)
            if seq is None:
                raise RuntimeError(f"talker bridge: unknown request {internal!r} in the batch")
            why = None
            if self.async_step:  # the code fed is on the device only (input_ids)
                if seq.past_hidden is None:
                    why = "decoded before its first code was sampled"
            elif not seq.codec_ids or token != seq.codec_ids[-1] or seq.past_hidden is None:
                why = (f"vLLM fed code {token}, the last sampled was "
                       f"{seq.codec_ids[-1] if seq.codec_ids else None}")
            if why is None and not seq.ready():
                why = f"trailing text {seq.gen_step} not available (scheduled while waiting)"
            if why is not None:
                self.errors[seq.request_id] = f"RuntimeError: {seq.request_id}: {why}"
            else:
                live.append(seq)
                row_of[seq.request_id] = r
        residual = {}
        t0 = time.perf_counter()
        sent = set()  # first frames, out the step they were made (first_frames)
        for seq in live:  # computed behind last step's sampler
            if (early := self.early.pop(seq.request_id, None)) is not None:
                residual[seq.request_id] = (early.frame, early.embed)
                self.spent["early_frames"] += 1
                if early.emitted:
                    sent.add(seq.request_id)
                elif early.copy is not None:
                    self._emitted.append(early.copy)
        rest = [seq for seq in live if seq.request_id not in residual]
        if self.batch_code_predictor and rest:
            try:
                code0 = None  # async: the codes vLLM feeds, as the host does not know them yet
                if self.async_step:
                    code0 = input_ids[to_device([row_of[s.request_id] for s in rest],
                                                input_ids.device)].to(torch.long)
                residual.update(self.inputs.residual_codes_batch(rest, frames_later=True,
                                                                 code0=code0))
            except Exception:  # one request at a time below isolates the failure
                pass
        ok = []
        for seq in live:
            try:
                got = residual.get(seq.request_id)
                if got is None and self.async_step:
                    raise RuntimeError("the code predictor made no frame for it")
                if got is None:
                    got = self.inputs.residual_codes(seq)
            except Exception as e:  # this request only: it fails, its row is zeros
                self.errors[seq.request_id] = f"{type(e).__name__}: {e}"
                continue
            ok.append((seq, got))
        t1 = time.perf_counter()
        self.spent["code_predictor_s"] += t1 - t0
        like = embed_codes(input_ids[:1])
        out = torch.zeros((len(rows), like.shape[-1]), dtype=like.dtype, device=like.device)
        if ok:
            # The batch's inputs in a fixed number of operators, whatever its size: one concat
            # of the codes' embeddings, one add of the text, one scatter into the step's rows.
            text = self.inputs.trailing_batch([seq for seq, _ in ok])  # [n, 1, D]
            embeds = torch.cat([codec_embed for _, (_, codec_embed) in ok]) + text
            at = {}
            for i, (seq, (frame, _)) in enumerate(ok):
                at[seq.request_id] = i
                seq.gen_step += 1
                if seq.request_id not in sent:
                    self.frames[seq.request_id] = frame
                    self.spent["frames"] += 1
            pairs = [(r, at[rid]) for r, (_, internal) in enumerate(rows)
                     if (rid := self.seqs[internal].request_id) in at]
            if pairs:
                if all(r == i for r, i in pairs):  # rows 0..m-1 in the batch's order
                    out[:len(pairs)] = embeds[:len(pairs), 0].to(out.dtype)
                else:
                    idx = to_device(list(zip(*pairs)), out.device)  # one copy: [2, m]
                    out[idx[0]] = embeds[idx[1], 0].to(out.dtype)
        self.spent["text_s"] += time.perf_counter() - t1
        return out

    def after_sampling(self, sampled: torch.Tensor) -> None:
        """Right behind vLLM's sampler (``sampled``: [rows, 1] codebook-0 codes, on the
        device): the code predictor for every row of ours that sampled a code, queued on the
        GPU without waiting, kept in ``early`` for the request's next step. The GPU runs it
        while vLLM and the engine finish this step and prepare the next on the CPU (in
        ``decode_embeds`` it ran after that preparation, the GPU idle meanwhile). Rows whose
        code is thrown away (a prompt still being prefilled) are skipped; a code that ends
        the request makes a frame nobody takes (dropped when the request is forgotten)."""
        fresh, self._fresh = self._fresh, 0
        batch = self.runner.input_batch
        n = batch.num_reqs
        if n == 0 or fresh != n or sampled.shape[0] < n:
            return  # warm-up, or on_logits did not take this step's hidden states
        try:
            self._after_sampling(sampled, n)
        except Exception:  # noqa: BLE001 - the next decode_embeds computes what is missing
            logger.exception("talker: the code predictor behind the sampler failed; it runs "
                             "in the next step's input from now on")
            self._sampler_hook.disable()

    def _after_sampling(self, sampled: torch.Tensor, n: int) -> None:
        batch = self.runner.input_batch
        discard = self.runner.discard_request_mask.np[:n]
        rows, seqs = [], []
        for i, internal in enumerate(batch.req_ids[:n]):
            seq = self.seqs.get(internal)
            if seq is not None and not discard[i] and seq.past_hidden is not None:
                rows.append(i)
                seqs.append(seq)
        if not seqs:
            return
        t0 = time.perf_counter()
        code0 = sampled[:n, 0] if len(rows) == n else sampled[to_device(rows, sampled.device), 0]
        code0 = code0.to(torch.long)
        if self.async_step:  # the penalty's seen codes, marked on the device next step
            for j, seq in enumerate(seqs):
                if seq.params.repetition_penalty != 1.0:
                    self.unmarked.setdefault(seq.request_id, []).append(code0[j:j + 1].clone())
        side = self._side_stream(sampled.device)
        with contextlib.ExitStack() as on_side:
            if side is not None:
                # behind the sampler on the GPU, but on a stream of its own: vLLM's wait for the
                # sampled codes (an event on its stream) does not wait for the code predictor
                side.wait_stream(torch.cuda.current_stream(sampled.device))
                code0.record_stream(side)  # inputs made on vLLM's stream: kept until read
                for seq in seqs:
                    seq.past_hidden.record_stream(side)
                on_side.enter_context(torch.cuda.stream(side))
            try:
                got = self.inputs.residual_codes_batch(seqs, frames_later=True, code0=code0)
            except Exception:  # the next step's decode_embeds computes them (and isolates it)
                got = {}
            event = self.inputs.take_frames_copy()
            if side is not None:
                self._cp_done = torch.cuda.Event()
                self._cp_done.record(side)
        for seq in seqs:
            if seq.request_id in got:
                self.early[seq.request_id] = _Early(seq, *got[seq.request_id], event)
        self.spent["code_predictor_s"] += time.perf_counter() - t0

    def _side_stream(self, device: torch.device):
        """The CUDA stream the code predictor runs on behind the sampler (None off CUDA)."""
        if device.type != "cuda":
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def join_side_stream(self) -> None:
        """Before each step: vLLM's stream waits (on the GPU; the CPU goes on) for the code
        predictor's last run: its results are read in this step, its CUDA graphs may be
        replayed on vLLM's stream, and its inputs (last step's hidden states) may be
        overwritten."""
        if self._cp_done is not None:
            torch.cuda.current_stream(self._stream.device).wait_event(self._cp_done)
            self._cp_done = None

    def frames_copied(self) -> None:
        """Wait for the host copies of the early frames this step emitted (done long since:
        they were queued a step ago)."""
        for event in self._emitted:
            event.synchronize()
        self._emitted.clear()

    def first_frames(self, finished) -> dict[str, torch.Tensor]:
        """{request id: frame} of the requests whose first frame the code predictor made
        behind this step's sampler, out now rather than with the next step (a step sooner to
        the first audio). The one wait for the GPU this costs (the frame's host copy) is paid
        in the steps that make a first frame only. ``finished``: requests that ended this
        step (a first code that ends the answer makes no frame)."""
        out = {}
        for rid, early in self.early.items():
            if early.emitted or early.seq.gen_step or rid in finished:
                continue
            if early.copy is not None:
                early.copy.synchronize()
            early.emitted = True
            if int(early.frame[0, 0]) == self.inputs.codec_eos:
                continue  # the answer ends before its first frame (async: not yet finished)
            out[rid] = early.frame
        self.spent["frames"] += len(out)
        return out

    def on_logits(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Keep each request's last hidden state; suppress non-codec ids (and the codec end
        for ``ignore_eos``); repetition penalty."""
        t0 = time.perf_counter()
        try:
            return self._on_logits(hidden, logits)
        finally:
            self.spent["logits_s"] += time.perf_counter() - t0

    def _on_logits(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self._suppress is None or self._suppress.device != logits.device:
            self._suppress = self.inputs.suppress.to(logits.device)
        logits[:, self._suppress] = float("-inf")
        batch = self.runner.input_batch
        n = batch.num_reqs
        if n == 0 or hidden.shape[0] != n:  # warm-up / profiling
            return logits
        penalized: list[TalkerSeq | None] = []
        new_rows, new_codes, no_eos = [], [], []  # new_codes: host ints, or device tensors
        self._fresh = n
        for i, internal in enumerate(batch.req_ids[:n]):
            seq = self.seqs.get(internal)
            if seq is not None:
                seq.past_hidden = hidden[i:i + 1].detach().unsqueeze(0).to(self._dtype)  # [1,1,D]
                if seq.params.ignore_eos:
                    no_eos.append(i)
            if seq is None or seq.params.repetition_penalty == 1.0:
                penalized.append(None)
                continue
            if seq.seen_mask is None or seq.seen_mask.device != logits.device:
                seq.seen_mask = torch.zeros(logits.shape[1], dtype=torch.bool,
                                            device=logits.device)
                seq.seen_marked = 0
            if self.async_step:
                fresh = self.unmarked.pop(seq.request_id, [])
            else:
                fresh = seq.codec_ids[seq.seen_marked:]  # sampled since the last step: one code
                seq.seen_marked = len(seq.codec_ids)
            new_rows += [i] * len(fresh)
            new_codes += fresh
            penalized.append(seq)
        if no_eos:  # TalkerInputs.suppressed: the codec end too
            logits[to_device(no_eos, logits.device), self.inputs.codec_eos] = float("-inf")
        if not any(penalized):
            return logits
        # transformers' rule over each request's generated codes, for the whole batch at once:
        # a [rows, vocab] mask of seen codes (each request's kept on the device, updated with
        # the codes sampled since), one where() (x / 1.0 and x * 1.0 are exact for the rest).
        if self._unseen is None or self._unseen.shape != logits.shape[1:] or \
                self._unseen.device != logits.device:
            self._unseen = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
        seen = torch.stack([s.seen_mask if s is not None else self._unseen for s in penalized])
        if new_rows and self.async_step:
            seen[to_device(new_rows, logits.device), torch.cat(new_codes)] = True
        elif new_rows:
            at = to_device([new_rows, new_codes], logits.device)
            seen[at[0], at[1]] = True
        for i, s in enumerate(penalized):
            if s is not None:
                s.seen_mask = seen[i]
        p = to_device([s.params.repetition_penalty if s is not None else 1.0
                       for s in penalized], logits.device, logits.dtype)[:, None]
        return torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)


@dataclass
class _Early:
    """The code predictor's result for the code vLLM sampled last (``after_sampling``)."""

    seq: TalkerSeq
    frame: torch.Tensor  # [1, 16], on the host once ``copy`` is done
    embed: torch.Tensor  # [1, 1, D]: the 16 codes' summed embeddings, the next step's input
    copy: object         # CUDA event of the frame's host copy (None off CUDA)
    emitted: bool = False  # a first frame, already out (first_frames)


class _AfterSampling:
    """vLLM's sampler, then the bridge's ``after_sampling`` on what it sampled (wraps the
    model runner's ``sampler``; its other attributes are the sampler's)."""

    def __init__(self, sampler, bridge: _Bridge):
        self._sampler = sampler
        self._bridge = bridge
        self._on = True
        bridge._sampler_hook = self

    def disable(self) -> None:
        self._on = False

    def __call__(self, *args, **kwargs):
        out = self._sampler(*args, **kwargs)
        if self._on:
            self._bridge.after_sampling(out.sampled_token_ids)
        return out

    def __getattr__(self, name):
        return getattr(self._sampler, name)


def _vllm_sampling_params(params: SamplingParams, max_tokens: int, codec_eos: int):
    """Codebook 0's sampling in vLLM. The repetition penalty is applied by the model's
    ``compute_logits`` (generated codes only, as transformers), so vLLM's is off."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        seed=None if params.greedy else params.seed, max_tokens=max_tokens,
        stop_token_ids=[codec_eos], ignore_eos=False, detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


@contextlib.contextmanager
def _async_scheduling_kept(on: bool):
    """While vLLM builds its config: on its CPU platform, which turns async scheduling off
    ("not required on CPU"), keep it on when the talker asks for it (its CPU tests check the
    async step against transformers)."""
    from vllm.platforms import current_platform

    if not on or not current_platform.is_cpu():
        yield
        return
    cls = type(current_platform)
    own = "check_and_update_config" in vars(cls)
    saved = vars(cls).get("check_and_update_config")
    original = cls.check_and_update_config

    def keep(vllm_config) -> None:
        original(vllm_config)
        vllm_config.scheduler_config.async_scheduling = True

    cls.check_and_update_config = staticmethod(keep)
    try:
        yield
    finally:
        if own:
            cls.check_and_update_config = saved
        else:
            del cls.check_and_update_config
