"""Tokenizer and the chat prompt format the thinker and talker expect."""

from __future__ import annotations

from pathlib import Path

# One placeholder per audio clip / image; the processor expands it to one token per encoder row.
AUDIO_PLACEHOLDER = "<|audio_start|><|audio_pad|><|audio_end|>"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def chat_prompt(messages: list[dict]) -> str:
    """``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then the assistant header.

    ``messages`` are ``{"role": "system"|"user"|"assistant", "content": str | list[part]}``; a
    part is ``{"type": "text", "text": str}``, ``{"type": "audio", ...}`` or
    ``{"type": "image", ...}`` (media parts become placeholders, in order). The tiny checkpoint's
    chat template (models/tiny.py) renders the same string.
    """
    parts = [f"<|im_start|>{m['role']}\n{_content(m['content'])}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def _content(content) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content:
        kind = part["type"]
        if kind == "text":
            out.append(part["text"])
        elif kind == "audio":
            out.append(AUDIO_PLACEHOLDER)
        elif kind == "image":
            out.append(IMAGE_PLACEHOLDER)
        else:
            raise ValueError(f"unknown content part type {kind!r}")
    return "".join(out)


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    return list(tokenizer(chat_prompt(messages), add_special_tokens=False).input_ids)


def speech_ids(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """Text to speech (``/v1/audio/speech``, ``Omni.speech_request``): the prompt (one user turn
    holding ``text``) and the answer the thinker is given instead of generating: ``text``'s
    tokens then ``<|im_end|>``, the stop token an answer ends with (the talker never speaks an
    answer's last token: runners/transformers/talker_inputs.py), so every token of ``text`` is voiced."""
    prompt = encode_chat(tokenizer, [{"role": "user", "content": text}])
    answer = list(tokenizer(text, add_special_tokens=False).input_ids)
    return prompt, answer + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
