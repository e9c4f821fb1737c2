"""Spoken answers kept for multi-turn: ``audio.id`` -> the answer's transcript until ``expires_at``.

OpenAI's chat API lets a later request name an earlier spoken answer by its id
(``{"role": "assistant", "audio": {"id": ...}}``) instead of resending it. Qwen3-Omni's prompt
holds an earlier assistant turn as its text, so the transcript is all the model needs: that turn
becomes ``{"role": "assistant", "content": transcript}``.

The store lives in one ingress replica's memory, bounded in entries and characters (the oldest
go first when full, even before they expire); an id is known only to the replica that answered
(docs/api.md says what that means with several ingress replicas).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

AUDIO_TTL_S = 3600  # an answer's ``expires_at`` is this long after it was made (OpenAI: 1 hour)
MAX_ENTRIES = 10_000
MAX_CHARS = 8_000_000  # transcripts' characters in all (~32 MB of str at worst)


class TranscriptStore:
    def __init__(self, ttl_s: float = AUDIO_TTL_S, max_entries: int = MAX_ENTRIES,
                 max_chars: int = MAX_CHARS, clock: Callable[[], float] = time.time):
        self.ttl_s, self.max_entries, self.max_chars, self.clock = ttl_s, max_entries, max_chars, clock
        self._items: OrderedDict[str, tuple[str, int]] = OrderedDict()  # id -> (text, expires_at)
        self._chars = 0
        self._lock = threading.Lock()

    def put(self, audio_id: str, transcript: str) -> int:
        """Keep ``transcript`` under ``audio_id``; returns its ``expires_at`` (unix seconds)."""
        expires_at = int(self.clock() + self.ttl_s)
        if len(transcript) > self.max_chars:  # never kept: the id will be unknown
            return expires_at
        with self._lock:
            self._drop(audio_id)
            self._items[audio_id] = (transcript, expires_at)
            self._chars += len(transcript)
            self._evict()
        return expires_at

    def get(self, audio_id: str) -> str | None:
        """The transcript, or None when unknown, expired or evicted."""
        with self._lock:
            item = self._items.get(audio_id)
            if item is None:
                return None
            if item[1] <= self.clock():
                self._drop(audio_id)
                return None
            return item[0]

    def __len__(self) -> int:
        return len(self._items)

    def _drop(self, audio_id: str) -> None:
        old = self._items.pop(audio_id, None)
        if old is not None:
            self._chars -= len(old[0])

    def _evict(self) -> None:
        now = self.clock()
        # Insertion order is expiry order (one TTL): expired ones are at the front.
        while self._items and (len(self._items) > self.max_entries or self._chars > self.max_chars
                               or next(iter(self._items.values()))[1] <= now):
            self._drop(next(iter(self._items)))
