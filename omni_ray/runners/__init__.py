"""Synchronous, Ray-free step loops that own a stage's model (thinker, talker, code2wav).

``transformers/`` and ``vllm/`` hold the two backends; ``factory.py`` picks one for a stage and
builds it from the stage's ``StageConfig`` (each runner's ``from_config``); ``sampling.py`` and
``kv.py`` (the portable KV layout) are shared by both.
"""
