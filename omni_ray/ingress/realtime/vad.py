"""Server-side turn detection for realtime sockets: WebRTC's VAD (``webrtcvad``) over 30 ms frames.

Torch-free and Ray-free. Times are milliseconds from the start of all audio the socket appended
(as OpenAI's ``audio_start_ms`` / ``audio_end_ms``). The input is pcm16 mono at 24 kHz; webrtcvad
takes 8/16/32/48 kHz, so each sample is doubled to 48 kHz (exact, stateless, frame-aligned; the
VAD band-limits to 4 kHz itself).

* speech starts at the first of ``START_FRAMES`` consecutive voiced frames; the turn's audio then
  begins ``prefix_padding_ms`` earlier (never before the buffer's start);
* it stops after ``silence_duration_ms`` of unvoiced frames; ``end_ms`` is that moment (the
  silence included, as OpenAI's ``audio_end_ms``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import webrtcvad

RATE = 24000
FRAME_MS = 30
FRAME_SAMPLES = RATE * FRAME_MS // 1000  # 720 at 24 kHz
START_FRAMES = 3  # 90 ms of voiced frames before a start is declared (clicks are no turn)


class TurnState(enum.Enum):
    SILENCE = "silence"
    SPEECH = "speech"


@dataclass(frozen=True)
class TurnEvent:
    kind: str      # "started" | "stopped"
    ms: int        # started: where the turn's audio begins (padding included); stopped: its end


def aggressiveness(threshold: float) -> int:
    """OpenAI's 0..1 ``threshold`` as webrtcvad's mode 0 (least aggressive) .. 3."""
    return min(3, max(0, int(threshold * 4)))


class TurnDetector:
    def __init__(self, threshold: float, prefix_padding_ms: int, silence_duration_ms: int,
                 origin_ms: int = 0):
        """``origin_ms``: where the first audio pushed lies in the socket's audio (a detector
        made by a ``session.update`` mid-socket starts there)."""
        self.vad = webrtcvad.Vad(aggressiveness(threshold))
        self.origin_ms = origin_ms
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_frames = max(1, -(-silence_duration_ms // FRAME_MS))
        self.state = TurnState.SILENCE
        self._pending = np.zeros(0, np.int16)  # samples not yet in a whole frame
        self._frames = 0                      # whole frames seen since the socket opened
        self._run = 0                         # consecutive voiced (SILENCE) / unvoiced (SPEECH)

    def push(self, pcm16: bytes, floor_ms: int = 0) -> list[TurnEvent]:
        """Feed appended audio; the starts and stops it completes. ``floor_ms``: where the
        current input buffer begins (a turn's padding never reaches before it)."""
        samples = np.concatenate([self._pending, np.frombuffer(pcm16, "<i2")])
        n = samples.size // FRAME_SAMPLES
        self._pending = samples[n * FRAME_SAMPLES:].copy()
        events = []
        for i in range(n):
            frame = samples[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES]
            voiced = self.vad.is_speech(np.repeat(frame, 2).astype("<i2").tobytes(), 2 * RATE)
            self._frames += 1
            ev = self._step(voiced, floor_ms)
            if ev is not None:
                events.append(ev)
        return events

    def _step(self, voiced: bool, floor_ms: int) -> TurnEvent | None:
        if self.state is TurnState.SILENCE:
            self._run = self._run + 1 if voiced else 0
            if self._run >= START_FRAMES:
                self.state, self._run = TurnState.SPEECH, 0
                first_ms = self.origin_ms + (self._frames - START_FRAMES) * FRAME_MS
                return TurnEvent("started", max(floor_ms, first_ms - self.prefix_padding_ms))
            return None
        self._run = 0 if voiced else self._run + 1
        if self._run >= self.silence_frames:
            self.state, self._run = TurnState.SILENCE, 0
            return TurnEvent("stopped", self.origin_ms + self._frames * FRAME_MS)
        return None

    def reset(self) -> None:
        """Forget a turn in progress (the buffer was committed or cleared by the client)."""
        self.state, self._run = TurnState.SILENCE, 0
