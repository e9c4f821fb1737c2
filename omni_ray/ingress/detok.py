"""Incremental detokenization: text deltas from token ids as they arrive.

Each token costs the same however long the answer is: ``tokenizers``' ``DecodeStream`` decodes only
the few ids since the last emitted piece and holds back a partial UTF-8 character. The deltas
concatenate to ``tokenizer.decode(ids, skip_special_tokens=True)`` (tests/ingress/test_detok.py);
``final`` flushes what is held back (a dangling partial character decodes as U+FFFD, as one-shot).
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer                # transformers' fast tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._held: list[int] = []                # ids since the last emitted piece
        self._parts: list[str] = []

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """New text since the last call."""
        out = []
        for t in token_ids:
            self._held.append(t)
            piece = self._stream.step(self._backend, int(t))
            if piece:
                out.append(piece)
                self._held.clear()
        if final and self._held:
            out.append(self.tokenizer.decode(self._held, skip_special_tokens=True))
            self._held.clear()
        delta = "".join(out)
        if delta:
            self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        return "".join(self._parts)
