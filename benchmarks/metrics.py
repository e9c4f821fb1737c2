"""Pure measurement pieces: SSE line parsing, one request's record, percentiles, RTF, summaries.

No I/O, no clocks read here: callers pass timestamps (``time.perf_counter()`` seconds), so every
function is checked on hand-made inputs (``tests/benchmarks/test_bench_smoke.py``).

Definitions (all seconds, from the moment the request was sent):

* TTFT: first non-empty ``choices[0].delta.content``;
* TTFA: first non-empty ``choices[0].delta.audio.data`` (base64 PCM16, 24 kHz mono);
* audio duration: streamed PCM16 samples / 24000;
* RTF: (last audio packet - request start) / audio duration (< 1: faster than real time);
* text RTF: (last text token - request start) / audio duration: the RTF's floor while the
  talker speaks the text as it streams (RTF close to it: the thinker's text paced the audio);
* stall: seconds a player starting at the first audio packet would wait for data
  (``playback_stall``); realtime: stall <= ``REALTIME_TOLERANCE_S``;
* end-to-end: ``data: [DONE]`` (or the stream's end) - request start.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

SAMPLE_RATE = 24000
PCM16_BYTES = 2
DONE = "[DONE]"  # what parse_sse_line returns for ``data: [DONE]``
# A stream is real time when its playback stalls at most this long in all. 10 ms: what an audio
# output buffer holds anyway (a 10 ms period; one eighth of an 80 ms codec frame), and above the
# benchmark client's own jitter (one Python event loop decoding 32 streams' SSE lines notes an
# arrival a few ms after the bytes came), which 0.0 would count as stalls the server never made.
REALTIME_TOLERANCE_S = 0.010


def parse_sse_line(line: str) -> dict | str | None:
    """One line of a ``text/event-stream`` body -> its JSON object, ``DONE``, or None.

    None for lines that carry no data (blank separators, ``: comments``, ``event:``/``id:``).
    Raises ``ValueError`` on a ``data:`` line whose payload is not JSON.
    """
    line = line.rstrip("\r\n")
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == DONE:
        return DONE
    if not payload:
        return None
    try:
        return json.loads(payload)
    except json.JSONDecodeError as e:
        raise ValueError(f"bad SSE data line: {payload[:80]!r}") from e


def b64_decoded_len(data: str) -> int:
    """Bytes encoded by a padded base64 string, without decoding it."""
    n = len(data)
    if n == 0:
        return 0
    if n % 4:
        raise ValueError(f"base64 length {n} is not a multiple of 4")
    return n // 4 * 3 - (2 if data.endswith("==") else 1 if data.endswith("=") else 0)


def rtf(generation_s: float | None, audio_s: float | None) -> float | None:
    """Real-time factor: seconds spent producing the audio per second of audio (None if none)."""
    if generation_s is None or not audio_s:
        return None
    return generation_s / audio_s


def playback_stalls(packets: list[tuple[float, int]],
                    rate: int = SAMPLE_RATE) -> list[tuple[float, float]]:
    """Where a player playing from the first audio packet's arrival runs dry: (seconds of
    audio played before it, seconds it waits) per late packet.

    ``packets``: (arrival time, samples) per audio packet, in arrival order. Packet i is due when
    the audio before it has played: t_first + samples before i / ``rate`` + the stall so far (a
    player that ran dry plays the rest that much later); a packet arriving after that waits the
    difference. Packets without samples are skipped; no audio (or one packet): [].
    """
    stalls, stall, before, t_first, prev = [], 0.0, 0, None, None
    for t, n in packets:
        if prev is not None and t < prev:
            raise ValueError(f"packets out of arrival order: {t} after {prev}")
        prev = t
        if n <= 0:
            continue
        if t_first is None:
            t_first = t
        wait = t - (t_first + before / rate + stall)
        if wait > 0:
            stalls.append((before / rate, wait))
            stall += wait
        before += n
    return stalls


def playback_stall(packets: list[tuple[float, int]], rate: int = SAMPLE_RATE) -> float:
    """Seconds a player playing from the first audio packet's arrival waits for data in all
    (``playback_stalls`` summed; 0.0 without any)."""
    return sum(wait for _, wait in playback_stalls(packets, rate))


# Where in the audio streams run dry (seconds played): one bin per early chunk of a
# one-frame-first ramp (``ramp_ratio`` 1: chunks start at 0.06, 0.14, 0.30, 0.62, 1.26, 2.54 s
# of audio; the old doubling's at 0.06, 0.22, 0.54, 1.18, 2.46 s), so the bins say which early
# chunk came late; the last is the steady state.
STALL_BINS_S = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2)


def stall_where(per_request: list[list[tuple[float, float]]],
                bins: tuple[float, ...] = STALL_BINS_S) -> dict:
    """Over requests' ``playback_stalls``, per bin of audio played ("<0.1s", ..., ">=2.6s"):
    the fraction of the requests that waited there more than ``REALTIME_TOLERANCE_S`` / 10
    (1 ms: below it is the client's clock), and their mean wait there in seconds."""
    names = [f"<{b}s" for b in bins] + [f">={bins[-1]}s"]
    out = {}
    for i, name in enumerate(names):
        lo = bins[i - 1] if i else 0.0
        hi = bins[i] if i < len(bins) else math.inf
        waits = [sum(w for pos, w in stalls if lo <= pos < hi) for stalls in per_request]
        hit = [w for w in waits if w > REALTIME_TOLERANCE_S / 10]
        out[name] = dict(requests_frac=len(hit) / len(waits) if waits else None,
                         mean_wait_s=sum(hit) / len(hit) if hit else 0.0)
    return out


def slower_than_realtime(requests: list[dict], most: int = 4) -> str | None:
    """The streams of RTF >= 1 (``requests``: gpu_check's per-request dicts, ``rtf``,
    ``audio_s``, ``ttfa_s``, ``stall_s``), the longest waits first, each with what makes its RTF:
    a stream whose audio is shorter than its wait for the first packet has RTF > 1 without ever
    running dry (a random-weight talker ending early). None where there is none."""
    slow = sorted((r for r in requests if r.get("rtf") is not None and r["rtf"] >= 1),
                  key=lambda r: -(r.get("stall_s") or 0.0))
    if not slow:
        return None
    shown = ", ".join(
        f"RTF {r['rtf']:.2f}: {r['audio_s']:.2f} s of audio, first at "
        f"{r['ttfa_s']:.3f} s, stalled {r.get('stall_s') or 0.0:.3f} s" for r in slow[:most])
    more = f", and {len(slow) - most} more" if len(slow) > most else ""
    return f"{len(slow)} of {len(requests)} streams: {shown}{more}"


@dataclass
class RequestRecord:
    """What one streamed request did; times are absolute ``perf_counter`` seconds."""

    start: float
    first_text: float | None = None
    last_text: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    end: float | None = None
    audio_bytes: int = 0
    audio_packets: int = 0
    text: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    request_id: str | None = None  # the chunks' ``id``: the app's request id (its timeline's)
    audio_arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, samples)

    def on_event(self, event: dict | str, now: float) -> None:
        """Fold one parsed SSE event (``parse_sse_line``'s output) in, received at ``now``."""
        if event == DONE:
            self.end = now
            return
        if self.request_id is None and event.get("id"):
            self.request_id = event["id"]
        if "error" in event:
            err = event["error"]
            self.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return
        if event.get("usage"):
            # Text tokens (the thinker's): completion_tokens also counts audio tokens.
            details = event["usage"].get("completion_tokens_details") or {}
            self.completion_tokens = details.get("text_tokens",
                                                 event["usage"].get("completion_tokens"))
            self.prompt_tokens = event["usage"].get("prompt_tokens")
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text += delta["content"]
                self.last_text = now
                if self.first_text is None:
                    self.first_text = now
            data = (delta.get("audio") or {}).get("data")
            if data:
                n = b64_decoded_len(data)
                self.audio_bytes += n
                self.audio_arrivals.append((now, n // PCM16_BYTES))
                self.audio_packets += 1
                self.last_audio = now
                if self.first_audio is None:
                    self.first_audio = now
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_text is None else self.first_text - self.start

    @property
    def ttfa(self) -> float | None:
        return None if self.first_audio is None else self.first_audio - self.start

    @property
    def text_rate(self) -> float | None:
        """Text tokens a second after the first (the thinker's decode speed as streamed)."""
        if self.first_text is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        span = self.last_text - self.first_text
        return (self.completion_tokens - 1) / span if span > 0 else None

    @property
    def audio_seconds(self) -> float:
        return self.audio_bytes / PCM16_BYTES / SAMPLE_RATE

    @property
    def rtf(self) -> float | None:
        gen = None if self.last_audio is None else self.last_audio - self.start
        return rtf(gen, self.audio_seconds)

    @property
    def text_rtf(self) -> float | None:
        """The RTF the audio would have had if it ended with the text: start to the last text
        token over the audio's duration. The talker speaks the text as the thinker streams it,
        so where ``rtf`` is close to this, the thinker's text rate paced the audio, not the
        speech stages (None without text or audio)."""
        gen = None if self.last_text is None else self.last_text - self.start
        return rtf(gen, self.audio_seconds)

    @property
    def stalls(self) -> list[tuple[float, float]]:
        """``playback_stalls`` of the audio packets: (audio played, wait) per late packet."""
        return playback_stalls(self.audio_arrivals)

    @property
    def stall_s(self) -> float | None:
        """``playback_stall`` of the audio packets (None without audio)."""
        return playback_stall(self.audio_arrivals) if self.audio_bytes else None

    @property
    def realtime(self) -> bool | None:
        """Playback from the first packet never runs dry (None without audio)."""
        stall = self.stall_s
        return None if stall is None else stall <= REALTIME_TOLERANCE_S

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    def summary(self) -> dict:
        """JSON-ready: the derived metrics plus the raw counts (text shortened)."""
        raw = asdict(self)
        raw["text"] = self.text[:80]
        return dict(start=self.start, ttft=self.ttft, ttfa=self.ttfa, text_rate=self.text_rate,
                    audio_seconds=self.audio_seconds, rtf=self.rtf, text_rtf=self.text_rtf,
                    stall_s=self.stall_s, realtime=self.realtime, e2e=self.e2e,
                    stalls=[(round(pos, 3), round(wait, 4)) for pos, wait in self.stalls],
                    output_tokens=self.completion_tokens,
                    ok=self.ok, **{k: raw[k] for k in ("audio_packets", "finish_reason",
                                                        "error", "text", "prompt_tokens",
                                                        "request_id")})


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: list[float | None]) -> dict:
    """n, mean, p50, p90, p99, min, max over the non-None values (n=0 and Nones if none)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return dict(n=0, mean=None, p50=None, p90=None, p99=None, min=None, max=None)
    return dict(n=len(xs), mean=sum(xs) / len(xs), p50=percentile(xs, 50),
                p90=percentile(xs, 90), p99=percentile(xs, 99), min=min(xs), max=max(xs))


@dataclass
class RunSummary:
    """Aggregate of one load level (a concurrency or a request rate)."""

    num_requests: int
    num_ok: int
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    audio_seconds_per_s: float
    metrics: dict = field(default_factory=dict)  # name -> stats() dict
    realtime_frac: float | None = None  # of the successful requests with audio (None: none)
    stall_where: dict = field(default_factory=dict)  # ``stall_where`` of those requests


def summarize(records: list[RequestRecord], wall_s: float) -> RunSummary:
    """Percentiles of each metric over successful requests; rates over ``wall_s``."""
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    ok = [r for r in records if r.ok]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    audio = sum(r.audio_seconds for r in ok)
    metrics = {name: stats([getattr(r, name) for r in ok])
               for name in ("ttft", "ttfa", "rtf", "text_rtf", "stall_s", "e2e",
                            "audio_seconds", "text_rate")}
    metrics["output_tokens"] = stats([r.completion_tokens for r in ok])
    rt = [r.realtime for r in ok if r.realtime is not None]
    return RunSummary(num_requests=len(records), num_ok=len(ok), wall_s=wall_s,
                      requests_per_s=len(ok) / wall_s, output_tokens_per_s=tokens / wall_s,
                      audio_seconds_per_s=audio / wall_s, metrics=metrics,
                      realtime_frac=sum(rt) / len(rt) if rt else None,
                      stall_where=stall_where([r.stalls for r in ok if r.audio_bytes]))
