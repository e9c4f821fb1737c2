"""A realtime socket's conversation items and its input audio buffer (plain data, Ray-free)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ConvItem:
    id: str
    role: str                      # user | assistant | system
    text: str = ""                 # text, or the transcript of an assistant's spoken answer
    pcm: bytes | None = None       # user audio: pcm16 mono 24 kHz
    audio_ms: int = 0              # assistant: the spoken answer's audio sent (truncate's bound)


@dataclass
class InputBuffer:
    """Appended audio not committed yet; ``start`` is its first sample's index in all the audio
    the socket appended (OpenAI's ms are counted from there)."""

    pcm: bytearray = field(default_factory=bytearray)
    start: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.pcm) // 2

    def take(self, a: int, b: int) -> bytes:
        """Samples [a, b) (absolute indices), leaving those after ``b`` in the buffer."""
        a, b = max(a, self.start), min(b, self.end)
        out = bytes(self.pcm[(a - self.start) * 2:(b - self.start) * 2])
        del self.pcm[:(b - self.start) * 2]
        self.start = b
        return out

    def drop_before(self, a: int) -> None:
        if a > self.start:
            del self.pcm[:(a - self.start) * 2]
            self.start = a


def merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` (nested dicts merged, anything else replaced; an explicit
    null replaces too: ``turn_detection: null`` turns detection off)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
