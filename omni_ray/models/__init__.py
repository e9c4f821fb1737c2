"""Checkpoint making and loading, tokenizer and prompt format."""
