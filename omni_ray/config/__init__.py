"""Typed, validated configuration: sampling, pipeline and serving arguments."""
