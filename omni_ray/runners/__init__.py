"""Synchronous, Ray-free step loops that own a stage's model (thinker, talker, code2wav)."""
