"""Tokenizer and the chat prompt format the thinker and talker expect."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def chat_prompt(messages: list[dict]) -> str:
    """``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then the assistant header.

    ``messages`` are ``{"role": "system"|"user"|"assistant", "content": str}``.
    """
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    return list(tokenizer(chat_prompt(messages), add_special_tokens=False).input_ids)
