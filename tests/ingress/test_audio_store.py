"""The multi-turn transcript store: expiry, bounds, replacement."""

from omni_ray.ingress.audio_store import TranscriptStore


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_kept_until_expires_at_then_gone():
    clock = Clock()
    s = TranscriptStore(ttl_s=60, clock=clock)
    assert s.put("audio_a", "hello") == 1060
    clock.t = 1059.5
    assert s.get("audio_a") == "hello"
    clock.t = 1060
    assert s.get("audio_a") is None and len(s) == 0
    assert s.get("audio_unknown") is None


def test_bounded_in_entries_and_characters_oldest_first():
    clock = Clock()
    s = TranscriptStore(ttl_s=60, max_entries=2, max_chars=10, clock=clock)
    s.put("a", "1234")
    s.put("b", "5678")
    s.put("c", "9")
    assert s.get("a") is None and s.get("b") == "5678" and s.get("c") == "9"
    s.put("d", "abcdefgh")  # 4 + 1 + 8 > 10 and 3 > 2: b goes
    assert s.get("b") is None and s.get("c") == "9" and s.get("d") == "abcdefgh"
    s.put("f", "12")  # 1 + 8 + 2 > 10: c goes
    assert s.get("c") is None and s.get("d") == "abcdefgh" and s.get("f") == "12"
    s.put("e", "x" * 11)  # larger than the whole store: not kept
    assert s.get("e") is None and s.get("d") == "abcdefgh" and s.get("f") == "12"


def test_expired_entries_are_dropped_on_put():
    clock = Clock()
    s = TranscriptStore(ttl_s=60, clock=clock)
    s.put("a", "x")
    clock.t += 61
    s.put("b", "y")
    assert len(s) == 1


def test_same_id_replaces():
    s = TranscriptStore(ttl_s=60, max_chars=5, clock=Clock())
    s.put("a", "1234")
    s.put("a", "5")
    assert s.get("a") == "5" and s._chars == 1
