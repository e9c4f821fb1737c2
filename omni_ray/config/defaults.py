"""Defaults decided here once: ``OmniRequest``, ``PipelineConfig``, the app's limits and the CLI
read them.

Torch-free (the CLI shows them in ``--help`` without importing torch).
"""

DEFAULT_SPEAKER = "ethan"
DEFAULT_MAX_TOKENS = 64           # text tokens from the thinker
DEFAULT_MAX_AUDIO_FRAMES = 600    # codec frames, 80 ms each (48 s)
DEFAULT_MODE = "async_chunk"      # stage delivery: the talker starts on the first text chunk
DEFAULT_CODE2WAV_MODE = "stateful"  # chunked vocoding with carried state (as one-shot audio)
DEFAULT_CODE2WAV_MAX_BATCH = 32   # requests per code2wav forward in bf16/fp16 (float32: 1, exact)
MAX_SPEECH_INPUT_CHARS = 4096     # /v1/audio/speech's and omni-ray speak's input (OpenAI's limit)
# Sampling a person would serve with (the CLI's --sample; the GPU yamls' default_sampling):
SAMPLED_THINKER = dict(temperature=0.7, top_p=0.9)
SAMPLED_TALKER = dict(temperature=0.9, top_k=50, repetition_penalty=1.05)  # vLLM-Omni's defaults
# Realtime sockets (WS /v1/realtime; omni_ray/ingress/realtime/): OpenAI's server_vad defaults.
REALTIME_SAMPLE_RATE = 24000      # pcm16 mono in and out, as OpenAI's "audio/pcm"
REALTIME_VAD_THRESHOLD = 0.5      # 0..1: webrtcvad's aggressiveness (0-3) is threshold * 4
REALTIME_PREFIX_PADDING_MS = 300  # audio kept before the detected start of speech
REALTIME_SILENCE_DURATION_MS = 500  # silence that ends a turn
REALTIME_IDLE_TIMEOUT_S = 300.0   # a socket with no client event for this long is closed
REALTIME_MAX_BUFFER_S = 120.0     # input audio held uncommitted (and one audio item's length)
REALTIME_MAX_ITEMS = 64           # conversation items kept per socket (the oldest dropped)
