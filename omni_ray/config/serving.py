"""Arguments of ``build_omni_app`` (Ray Serve's ``import_path`` + ``args`` convention).

Validated once, at load: a bad value fails with a message naming the field. Everything a replica
needs flows down from here explicitly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from omni_ray.config import defaults as D
from omni_ray.config.defaults import DEFAULT_MAX_AUDIO_FRAMES, DEFAULT_MAX_TOKENS, DEFAULT_SPEAKER
from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.sampling import THINKER_GREEDY, TALKER_GREEDY, SamplingParams
from omni_ray.mps import PRIORITY_ENV, SM_PERCENT_ENV

Backend = Literal["transformers", "vllm"]
_SERVE_OPTION_KEYS = {
    "num_replicas", "autoscaling_config", "max_ongoing_requests", "max_queued_requests",
    "ray_actor_options", "health_check_period_s", "health_check_timeout_s",
    "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s", "user_config",
    "placement_group_bundles", "placement_group_strategy", "request_router_config",
    "backpressure_config",
}


MPS_FIELDS = ("mps_sm_percent", "mps_low_priority")  # EngineResources.with_mps


class EngineResources(BaseModel):
    """Resources of the engine actor that owns a stage replica's model (the replica itself is
    a light async front and takes none)."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(0, ge=0)
    num_gpus: float = Field(0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)
    # Stages sharing one GPU through NVIDIA MPS (README.md "On one GPU"); both are ignored
    # where the GPU is not shared through MPS.
    mps_sm_percent: int | None = Field(
        None, ge=1, le=100, description="under MPS: the engine's kernels on at most this share "
                                        "of the GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); "
                                        "unset: all of them")
    mps_low_priority: bool = Field(
        False, description="under MPS: the engine is a client of below-normal priority "
                           "(CUDA_MPS_CLIENT_PRIORITY=1), its kernels scheduled after the "
                           "other stages' ready ones")

    def with_mps(self, changes: dict) -> EngineResources:
        """A copy with MPS fields changed: what a running stage's engine can be replaced with
        (``POST /debug/engines``). ``ValueError`` naming any other field; pydantic's
        ``ValidationError`` for a bad value."""
        other = sorted(set(changes) - set(MPS_FIELDS))
        if other:
            raise ValueError(f"{other[0]}: only {', '.join(MPS_FIELDS)} change on a running "
                             "engine")
        return EngineResources.model_validate({**self.model_dump(), **changes})

    def env_vars(self) -> dict[str, str]:
        """The engine actor's environment for the MPS settings above (empty: none set)."""
        env = {}
        if self.mps_sm_percent is not None:
            env[SM_PERCENT_ENV] = str(self.mps_sm_percent)
        if self.mps_low_priority:
            env[PRIORITY_ENV] = "1"
        return env


class EngineRestartConfig(BaseModel):
    """What a stage replica does when its engine actor dies (docs/faults.md, "A stage's engine
    dies"). The replica starts a new engine itself, at once; meanwhile the stage answers 503 +
    ``Retry-After``. Past ``max_restarts`` deaths within ``window_s`` it stops and fails Serve's
    health check instead, so Serve replaces the whole replica (``health_check_period_s``). With
    ``standby`` the replica keeps a loaded engine in reserve and the failover takes no model load."""

    model_config = ConfigDict(extra="forbid")

    max_restarts: int = Field(3, ge=0, description="engine restarts allowed per window; 0: "
                                                   "never restart (Serve replaces the replica)")
    window_s: float = Field(600.0, gt=0, description="the window max_restarts counts deaths in")
    retry_after_s: int = Field(1, ge=1, description="Retry-After of the 503 while restarting")
    standby: bool = Field(False, description="keep a second, loaded (and warmed) engine actor "
                                             "per replica and promote it the moment the active "
                                             "one dies; doubles engine_resources (docs/faults.md)")


class StageConfig(BaseModel):
    """One stage: its backend, engine and Serve deployment options."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend = "transformers"
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_num_seqs: int = Field(32, ge=1, le=4096)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict,
                                          description="passed through to the backend (vLLM)")
    default_sampling: SamplingParams | None = None
    compile_graphs: bool | None = Field(
        None, description="CUDA: the PyTorch parts a stage runs in its own CUDA graphs (the "
                          "talker's code predictor) are torch.compile'd first, for fused kernels "
                          "(compiled at start, cached on disk); false: eager kernels in the "
                          "graphs. Unset: on for bfloat16/float16, off for float32 (bit-equal "
                          "to the eager path, as the exactness checks need). No effect on CPU")
    fused_code_predictor: bool | None = Field(
        None, description="CUDA: the code predictor's graphs run each layer's q/k/v projections "
                          "as one GEMM and gate/up as one (4 launches a layer of 7, 15 steps x "
                          "5 layers a frame); false: transformers' separate projections. Unset: "
                          "as compile_graphs (off in float32, which stays bit-equal to the eager "
                          "path). No effect on CPU")
    early_code_predictor: bool = Field(
        True, description="vLLM talker: the batched code predictor runs right behind "
                          "vLLM's sampler (on CUDA on a stream of its own), while the CPU "
                          "ends the step and prepares the next; false: in the next step's "
                          "input, after that preparation (the GPU idle meanwhile). The same "
                          "frames either way")
    engine_resources: EngineResources = Field(default_factory=EngineResources)
    engine_restart: EngineRestartConfig = Field(default_factory=EngineRestartConfig)
    deployment_config: dict[str, Any] = Field(
        default_factory=dict, description="passed through to serve.deployment (num_replicas, ...)")

    @model_validator(mode="after")
    def _compile_by_dtype(self) -> "StageConfig":
        # One rule for both kernel-level speedups: float32 stays bit-equal to the eager path.
        fast_kernels = self.dtype != "float32"
        if self.compile_graphs is None:
            self.compile_graphs = fast_kernels
        if self.fused_code_predictor is None:
            self.fused_code_predictor = fast_kernels
        return self

    @field_validator("deployment_config")
    @classmethod
    def _known_serve_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - _SERVE_OPTION_KEYS)
        if unknown:
            raise ValueError(f"unknown Serve deployment option(s) {unknown}; "
                             f"allowed: {sorted(_SERVE_OPTION_KEYS)}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not (v == "cpu" or v == "cuda" or v.startswith("cuda:")):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {v!r}")
        return v


class KVTimeouts(BaseModel):
    """Bounds on every wait of a KV hand-off (see docs/kv_transfer.md)."""

    model_config = ConfigDict(extra="forbid")

    prefill_s: float = Field(30.0, gt=0, description="prefill + the sender's save, end to end")
    transfer_s: float = Field(10.0, gt=0, description="the receiver's fetch of the KV bytes")
    load_s: float = Field(10.0, gt=0, description="the receiver's load into its runner")


class ThinkerDisaggConfig(BaseModel):
    """Thinker prefill/decode disaggregation: ``ThinkerPrefill:<id>`` runs prompts and hands the
    KV to ``ThinkerDecode:<id>``, which decodes and feeds the talker (it plays the thinker role).
    Sampling defaults still come from ``thinker.default_sampling``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    prefill: StageConfig = Field(default_factory=StageConfig)
    decode: StageConfig = Field(default_factory=StageConfig)
    timeouts: KVTimeouts = Field(default_factory=KVTimeouts)
    fallback: Literal["local_prefill", "error"] = Field(
        "local_prefill", description="when a hand-off fails: prefill on the decode replica "
                                     "(same answer) or end the request with an error")

    @model_validator(mode="after")
    def _check(self) -> "ThinkerDisaggConfig":
        if self.prefill.dtype != self.decode.dtype:
            raise ValueError(f"thinker_disaggregation: prefill.dtype ({self.prefill.dtype}) and "
                             f"decode.dtype ({self.decode.dtype}) must match")
        return self


class LimitsConfig(BaseModel):
    """Input limits; each violation is answered with a 4xx naming the limit."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(32 << 20, ge=1024, description="a request body (base64 media "
                                "included)")
    max_messages: int = Field(64, ge=1)
    max_prompt_tokens: int = Field(4096, ge=1)
    max_prompt_chars_per_token: int = Field(
        32, ge=1, description="text over max_prompt_tokens x this many characters is refused "
                              "before tokenizing (a token rarely covers more)")
    max_content_parts: int = Field(256, ge=1, description="content parts in one request")
    max_tokens: int = Field(1024, ge=1, description="upper bound of a request's max_tokens")
    default_max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    max_audio_frames: int = Field(1500, ge=1, description="upper bound on 80 ms codec frames")
    default_max_audio_frames: int = Field(DEFAULT_MAX_AUDIO_FRAMES, ge=1)
    max_audio_bytes: int = Field(20 << 20, ge=1,
                                 description="decoded size of one input_audio part")
    max_image_bytes: int = Field(10 << 20, ge=1,
                                 description="decoded (or fetched) size of one image_url part")
    max_audio_seconds: float = Field(300.0, gt=0, description="duration of one input_audio part")
    max_image_pixels: int = Field(4096 * 4096, ge=1,
                                  description="width x height of one image (before resizing)")
    max_media_parts: int = Field(16, ge=0, description="audio + image parts in one request")
    max_concurrent_requests_per_key: int = Field(
        0, ge=0, description="in-flight POSTs per API key and ingress replica; 0: unlimited")

    @property
    def max_prompt_chars(self) -> int:
        """Characters of prompt text checked before tokenizing (the one place it is decided)."""
        return self.max_prompt_tokens * self.max_prompt_chars_per_token


class RealtimeConfig(BaseModel):
    """``WS /v1/realtime`` (omni_ray/ingress/realtime/): a socket's limits and the turn detection
    a session starts with (a client's ``session.update`` changes its own)."""

    model_config = ConfigDict(extra="forbid")

    idle_timeout_s: float = Field(D.REALTIME_IDLE_TIMEOUT_S, gt=0, description="a socket with "
                                  "no client event for this long is closed and its state freed")
    max_buffer_seconds: float = Field(D.REALTIME_MAX_BUFFER_S, gt=0, description="uncommitted "
                                      "input audio; more is an error event (the audio dropped)")
    max_items: int = Field(D.REALTIME_MAX_ITEMS, ge=2, description="conversation items kept per "
                           "socket; older ones leave the context")
    vad_threshold: float = Field(D.REALTIME_VAD_THRESHOLD, ge=0, le=1)
    prefix_padding_ms: int = Field(D.REALTIME_PREFIX_PADDING_MS, ge=0)
    silence_duration_ms: int = Field(D.REALTIME_SILENCE_DURATION_MS, ge=30)


PLAIN_KEYS_ERROR = (
    "security.api_keys: keys in plain text are refused (Ray Serve prints a config's args, keys "
    "included, to its logs and console before the app is built; rotate any key written there). "
    "Use security.api_keys_env (an env var of the ingress's node), security.api_keys_file (a "
    "file, one key per line) or, from Python, pydantic.SecretStr values; see docs/security.md")


class SecurityConfig(BaseModel):
    """Who may call the API and what the ingress may do on a request's behalf (docs/security.md).

    Keys never travel in plain text through the app's ``args``: Ray Serve logs a config deploy's
    ``args`` ("Importing application ... with arguments {...}") before ``build_omni_app`` runs.
    They come from the ingress replica's environment (``api_keys_env``), a file on its node
    (``api_keys_file``) or, from Python only, as ``SecretStr`` in ``api_keys`` (``**********`` in
    reprs, dumps and Serve's records of deployment init args). Only the ingress's guard reads them.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # keys: never echoed

    api_keys: list[SecretStr] = Field(default_factory=list, repr=False,
                                      description="Python API only: accepted Bearer keys as "
                                                  "SecretStr; plain strings are refused")
    api_keys_env: str | None = Field("OMNI_RAY_API_KEYS",
                                     description="env var with comma-separated keys, if set")
    api_keys_file: str | None = Field(None, description="file with one key per line (blank "
                                                        "lines and '#' comments skipped)")
    enable_debug_endpoints: bool = False
    enable_metrics_endpoint: bool = False
    log_prompts: bool = Field(False, description="debug only: log each request's prompt text")
    allow_fault_injection: bool = Field(False, description="tests only: x-omni-fault header")
    allow_remote_media: bool = Field(False, description="fetch http(s) URLs in content parts")
    allowed_media_hosts: list[str] = Field(
        default_factory=list, description="hosts that may be fetched ('*.example.com' for "
                                          "subdomains); empty: none")
    media_fetch_timeout_s: float = Field(5.0, gt=0, le=120)
    max_media_fetch_bytes: int = Field(10 << 20, ge=1)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _secret_keys_only(cls, v: Any) -> Any:
        # A plain string here came from a config file's args (already printed by Serve) or
        # from Python code that did not mark it secret: refused either way.
        if isinstance(v, list) and any(not isinstance(k, SecretStr) for k in v):
            raise ValueError(PLAIN_KEYS_ERROR)
        return v

    @field_validator("api_keys")
    @classmethod
    def _real_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        for i, key in enumerate(v):
            value = key.get_secret_value()
            if not value.strip() or set(value) == {"*"}:
                # A masked dump ("**********") fed back in must not become a working key.
                raise ValueError(f"api_keys.{i}: empty or masked key")
        return v

    @field_validator("allowed_media_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        out = [h.strip().lower().rstrip(".") for h in v]
        bad = [h for h in out if not h or "/" in h or ":" in h.replace("*.", "")]
        if bad:
            raise ValueError(f"allowed_media_hosts: bare host names only, got {bad}")
        return out


def _dummy_error(info: dict) -> str:
    return (f"model: the checkpoint is an `omni-ray make-dummy` stand-in with RANDOM weights "
            f"(shape {info.get('shape')!r}); set allow_dummy_weights: true to serve it")


class OmniServingArgs(BaseModel):
    """Everything ``build_omni_app`` needs."""

    # Errors name the field and the rule but never echo the input: it may hold API keys.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    model: str = Field("tiny", description="checkpoint dir, a Hugging Face hub id "
                       "('Qwen/Qwen3-Omni-30B-A3B-Instruct', fetched into the hub cache), or "
                       "'tiny' for the embedded default (random weights)")
    revision: str | None = Field(None, description="hub branch, tag or commit of `model`")
    model_id: str = Field("qwen3-omni", min_length=1, description="name served in /v1/models")
    make_tiny_if_missing: bool = Field(
        False, description="make the tiny checkpoint at `model` when that directory is missing "
                           "(off: a mistyped path is an error, never random weights)")
    allow_dummy_weights: bool = Field(
        False, description="serve an `omni-ray make-dummy` stand-in checkpoint (random weights)")
    max_model_len: int = Field(8192, ge=16)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    thinker: StageConfig = Field(default_factory=lambda: StageConfig(default_sampling=THINKER_GREEDY))
    talker: StageConfig = Field(default_factory=lambda: StageConfig(default_sampling=TALKER_GREEDY))
    code2wav: StageConfig = Field(default_factory=StageConfig)
    thinker_disaggregation: ThinkerDisaggConfig | None = Field(
        None, description="split the thinker into prefill and decode deployments")
    ingress_deployment_config: dict[str, Any] = Field(default_factory=dict)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    realtime: RealtimeConfig = Field(default_factory=RealtimeConfig)
    default_speaker: str = DEFAULT_SPEAKER

    @model_validator(mode="after")
    def _cross_checks(self) -> "OmniServingArgs":
        # A stage given as a dict without default_sampling keeps the stage's default (the
        # talker's repetition penalty), as when the stage is left out entirely.
        if self.thinker.default_sampling is None:
            self.thinker.default_sampling = THINKER_GREEDY
        if self.talker.default_sampling is None:
            self.talker.default_sampling = TALKER_GREEDY
        if self.code2wav.backend == "vllm":
            raise ValueError("code2wav.backend: only 'transformers' (PyTorch, batched across "
                             "requests) is available; thinker and talker may be 'vllm'")
        if self.limits.default_max_tokens > self.limits.max_tokens:
            raise ValueError("limits.default_max_tokens must be <= limits.max_tokens")
        if self.limits.default_max_audio_frames > self.limits.max_audio_frames:
            raise ValueError("limits.default_max_audio_frames must be <= limits.max_audio_frames")
        if not self.allow_dummy_weights and self.model != "tiny":
            # At deploy time (build_omni_app validates its args), not only at replica start.
            from omni_ray.models.dummy import dummy_info

            info = dummy_info(self.model)
            if info is not None:
                raise ValueError(_dummy_error(info))
        return self

    @property
    def disaggregated(self) -> bool:
        """Whether the thinker runs as ThinkerPrefill + ThinkerDecode deployments."""
        return self.thinker_disaggregation is not None and self.thinker_disaggregation.enabled

    def checkpoint_dir(self) -> str:
        """The checkpoint to load, made first when it is the tiny default (or allowed to be)."""
        from pathlib import Path

        from omni_ray.constants import default_model_dir
        from omni_ray.models.tiny import ensure_tiny_checkpoint

        if self.model == "tiny" or (self.make_tiny_if_missing and not Path(self.model).exists()):
            path = str(default_model_dir()) if self.model == "tiny" else self.model
            ensure_tiny_checkpoint(path)
        path = self.resolved_model_dir()
        if not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"model: no checkpoint directory at {path!r}")
        if self.check_dummy_weights(path) is None:
            from omni_ray.models.random_weights import random_weights_warning

            note = random_weights_warning(path)  # the tiny checkpoint: random too, say so
            if note:
                import logging

                logging.getLogger("ray.serve").warning(note.removeprefix("WARNING: "))
        return path

    def check_dummy_weights(self, path: str | None = None) -> dict | None:
        """The dummy marker of the checkpoint (None for real weights). A dummy checkpoint is an
        error unless ``allow_dummy_weights``; when allowed, a WARNING says so (every replica
        start calls this through ``checkpoint_dir``)."""
        import logging

        from omni_ray.models.dummy import dummy_info

        path = path or self.resolved_model_dir()
        info = dummy_info(path)
        if info is None:
            return None
        if not self.allow_dummy_weights:
            raise ValueError(_dummy_error(info))
        logging.getLogger("ray.serve").warning(
            "serving RANDOM weights (omni-ray make-dummy stand-in, shape %s, seed %s) from %s",
            info.get("shape"), info.get("seed"), path)
        return info

    def resolved_model_dir(self) -> str:
        """The checkpoint path every replica loads ('tiny' maps to the embedded default, a hub
        id to its snapshot in the Hugging Face cache, downloaded if missing)."""
        from omni_ray.constants import default_model_dir
        from omni_ray.models.hub import resolve_model

        if self.model == "tiny":
            return str(default_model_dir())
        return resolve_model(self.model, self.revision)
