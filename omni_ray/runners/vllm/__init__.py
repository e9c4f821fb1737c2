"""The vLLM backend: thinker and talker backbones on vLLM engines, and the glue they need."""
