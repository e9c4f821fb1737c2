"""Incremental detokenization: text deltas from a growing list of token ids."""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """New text since the last call (holds back a trailing partial UTF-8 character)."""
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta = text[len(self.sent):] if text.startswith(self.sent) else text
        self.sent = text
        return delta

    @property
    def text(self) -> str:
        return self.sent
