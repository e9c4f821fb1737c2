"""The transformers backend: step loops over transformers' own Qwen3-Omni modules."""
