"""Defaults decided here once: ``OmniRequest``, ``PipelineConfig``, the app's limits and the CLI
read them.

Torch-free (the CLI shows them in ``--help`` without importing torch).
"""

DEFAULT_SPEAKER = "ethan"
DEFAULT_MAX_TOKENS = 64           # text tokens from the thinker
DEFAULT_MAX_AUDIO_FRAMES = 600    # codec frames, 80 ms each (48 s)
DEFAULT_MODE = "async_chunk"      # stage delivery: the talker starts on the first text chunk
DEFAULT_CODE2WAV_MODE = "stateful"  # chunked vocoding with carried state (as one-shot audio)
