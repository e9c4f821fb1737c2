"""The benchmarks' pure pieces on hand-made inputs: SSE parsing, record folding, percentiles, RTF,
playback stall.

Nothing here is timed; the benchmarks themselves run from ``benchmarks/run_all.sh``.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root holds benchmarks/

from benchmarks.metrics import (  # noqa: E402
    DONE,
    REALTIME_TOLERANCE_S,
    SAMPLE_RATE,
    RequestRecord,
    b64_decoded_len,
    parse_sse_line,
    percentile,
    playback_stall,
    playback_stalls,
    stall_where,
    rtf,
    slower_than_realtime,
    stats,
    summarize,
)


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}"


def delta(content=None, audio=None, finish=None) -> dict:
    d = {}
    if content is not None:
        d["content"] = content
    if audio is not None:
        d["audio"] = {"id": "audio_1", "data": audio, "transcript": ""}
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def pcm_b64(samples: int) -> str:
    return base64.b64encode(b"\x01\x00" * samples).decode()


# -- SSE lines ------------------------------------------------------------------------------------
def test_parse_sse_line_kinds():
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert parse_sse_line('data:{"a": 1}\r\n') == {"a": 1}
    assert parse_sse_line("data: [DONE]") == DONE
    for line in ("", "\n", ": keep-alive", "event: message", "id: 3", "data:"):
        assert parse_sse_line(line) is None


def test_parse_sse_line_rejects_bad_json():
    with pytest.raises(ValueError, match="bad SSE data line"):
        parse_sse_line("data: {not json")


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 47, 48000])
def test_b64_decoded_len_matches_decoding(n):
    s = base64.b64encode(bytes(range(256)) * (n // 256) + bytes(n % 256)).decode()
    assert b64_decoded_len(s) == len(base64.b64decode(s)) == n


def test_b64_decoded_len_rejects_unpadded():
    with pytest.raises(ValueError):
        b64_decoded_len("abc")


# -- one request's stream -------------------------------------------------------------------------
def stream_record() -> RequestRecord:
    """A hand-made stream: role, text at 0.1, audio at 0.5 / 1.5, usage, done at 2.0."""
    rec = RequestRecord(start=10.0)
    lines = [
        (10.05, sse(delta(content=""))),          # the role chunk: empty content is not a token
        (10.10, sse(delta(content="Hi"))),
        (10.20, ""),
        (10.30, sse(delta(content=" there"))),
        (10.50, sse(delta(audio=pcm_b64(24000)))),  # 1.0 s
        (10.60, sse(delta(audio=""))),             # transcript-only audio delta: no samples
        (11.50, sse(delta(audio=pcm_b64(12000)))),  # 0.5 s
        (11.60, sse(delta(finish="length"))),
        (11.70, sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 64,
                                              "total_tokens": 71}})),
        (12.00, "data: [DONE]"),
    ]
    for t, line in lines:
        ev = parse_sse_line(line)
        if ev is not None:
            rec.on_event(ev, t)
    return rec


def test_record_times_and_counts():
    rec = stream_record()
    assert rec.ok and rec.error is None
    assert rec.text == "Hi there"
    assert rec.ttft == pytest.approx(0.10)
    assert rec.ttfa == pytest.approx(0.50)
    assert rec.audio_packets == 2
    assert rec.audio_seconds == pytest.approx(1.5)
    assert rec.e2e == pytest.approx(2.0)
    assert (rec.completion_tokens, rec.prompt_tokens) == (64, 7)
    assert rec.finish_reason == "length"


def test_rtf_is_start_to_last_audio_over_duration():
    rec = stream_record()
    assert rec.rtf == pytest.approx(1.5 / 1.5)  # last audio at +1.5 s, 1.5 s of audio
    assert rtf(3.0, 12.0) == pytest.approx(0.25)
    assert rtf(3.0, 0.0) is None and rtf(None, 2.0) is None


def test_text_rtf_is_start_to_last_text_over_the_audio():
    rec = stream_record()
    assert rec.text_rtf == pytest.approx(0.30 / 1.5)  # last text at +0.3 s, 1.5 s of audio
    assert rec.summary()["text_rtf"] == rec.text_rtf
    silent = RequestRecord(start=0.0)
    silent.on_event(parse_sse_line(sse(delta(content="Hi"))), 0.2)
    assert silent.text_rtf is None  # no audio
    assert summarize([rec], 2.0).metrics["text_rtf"]["p50"] == pytest.approx(0.2)


def test_record_error_event_and_missing_done():
    rec = RequestRecord(start=0.0)
    rec.on_event({"error": {"message": "boom", "type": "server_error"}}, 1.0)
    rec.on_event(DONE, 1.1)
    assert not rec.ok and rec.error == "boom"
    assert not RequestRecord(start=0.0).ok  # no [DONE]: not ok
    text_only = RequestRecord(start=0.0)
    text_only.on_event(delta(content="x"), 0.2)
    text_only.on_event(DONE, 0.3)
    assert text_only.ok and text_only.ttfa is None and text_only.rtf is None


# -- playback stall -------------------------------------------------------------------------------
SEC = SAMPLE_RATE  # samples in one second of audio


def test_no_stall_when_every_packet_comes_before_it_is_due():
    # 1 s packets: due at 5, 6, 7 (played from the first's arrival); they come at 5, 5.2, 6.9
    assert playback_stall([(5.0, SEC), (5.2, SEC), (6.9, SEC)]) == 0.0
    # exactly on time is no stall either
    assert playback_stall([(5.0, SEC // 2), (5.5, SEC // 2), (6.0, SEC)]) == pytest.approx(0.0)


def test_one_late_packet_stalls_by_its_lateness():
    # the second 1 s packet is due at 1.0 and comes at 1.3: playback waits 0.3 s
    assert playback_stall([(0.0, SEC), (1.3, SEC)]) == pytest.approx(0.3)
    # half-second packets: due at 0.0, 0.5, 1.0; the third comes at 1.25
    assert playback_stall([(0.0, SEC // 2), (0.4, SEC // 2), (1.25, SEC // 2)]) == (
        pytest.approx(0.25))


def test_a_stall_shifts_the_later_deadlines():
    # 1 s packets: the second comes 0.5 s late (at 1.5), so playback of it ends at 2.5 and the third
    # is due at 2.5, not 2.0: arriving at 2.4 it adds nothing (without the shift it would be 0.4)
    assert playback_stall([(0.0, SEC), (1.5, SEC), (2.4, SEC)]) == pytest.approx(0.5)
    # arriving at 2.7 it adds only what it is late against the shifted deadline: 0.2
    assert playback_stall([(0.0, SEC), (1.5, SEC), (2.7, SEC)]) == pytest.approx(0.7)
    # two separate stalls add up: 0.5 s, then the fourth is due at 3.5 and comes at 3.6
    assert playback_stall([(0.0, SEC), (1.5, SEC), (2.4, SEC), (3.6, SEC)]) == (
        pytest.approx(0.6))


def test_stalls_say_where_in_the_audio_the_player_ran_dry():
    # the stalls of the test above, each at the audio played before its packet
    stalls = playback_stalls([(0.0, SEC), (1.5, SEC), (2.4, SEC), (3.6, SEC)])
    assert [pos for pos, _ in stalls] == [1.0, 3.0]
    assert [wait for _, wait in stalls] == [pytest.approx(0.5), pytest.approx(0.1)]
    # bins of audio played: request 1 waits 0.5 s at 1.0 s and 0.1 s at 3.0 s; request 2 waits
    # 0.2 s at 0.05 s and 0.0005 s (client jitter, not a stall) at 1.0 s; request 3 never
    where = stall_where([stalls, [(0.05, 0.2), (1.0, 0.0005)], []], bins=(0.1, 2.0))
    third = pytest.approx(1 / 3)
    assert where == {"<0.1s": dict(requests_frac=third, mean_wait_s=pytest.approx(0.2)),
                     "<2.0s": dict(requests_frac=third, mean_wait_s=pytest.approx(0.5)),
                     ">=2.0s": dict(requests_frac=third, mean_wait_s=pytest.approx(0.1))}
    assert stall_where([])["<0.1s"] == dict(requests_frac=None, mean_wait_s=0.0)


def test_a_one_packet_answer_never_stalls_however_late_it_starts():
    assert playback_stall([(42.0, 2 * 1920)]) == 0.0  # 0.16 s, whatever its time to first audio
    assert playback_stall([]) == 0.0


def test_packets_without_samples_are_skipped_and_order_is_checked():
    # an empty packet neither starts playback nor counts as late
    assert playback_stall([(0.0, 0), (1.0, SEC), (1.9, 0), (2.0, SEC)]) == 0.0
    with pytest.raises(ValueError):
        playback_stall([(1.0, SEC), (0.5, SEC)])


def test_record_stall_and_realtime_from_its_packets():
    rec = stream_record()  # 1.0 s at +0.5, 0.5 s at +1.5: on time
    assert rec.audio_arrivals == [(10.50, 24000), (11.50, 12000)]
    assert rec.stall_s == pytest.approx(0.0) and rec.realtime is True
    assert rec.rtf == pytest.approx(1.0)  # RTF 1 though playback never waits
    late = RequestRecord(start=0.0)
    late.on_event(delta(audio=pcm_b64(SEC // 10)), 2.0)  # 0.1 s, first audio after 2 s
    late.on_event(delta(audio=pcm_b64(SEC // 10)), 2.1 + 2 * REALTIME_TOLERANCE_S)
    late.on_event(DONE, 2.5)
    assert late.stall_s == pytest.approx(2 * REALTIME_TOLERANCE_S) and late.realtime is False
    short = RequestRecord(start=0.0)  # within the tolerance: still realtime
    short.on_event(delta(audio=pcm_b64(SEC // 10)), 2.0)
    short.on_event(delta(audio=pcm_b64(SEC // 10)), 2.1 + REALTIME_TOLERANCE_S / 2)
    short.on_event(DONE, 2.5)
    assert short.realtime is True and short.rtf > 10  # a short answer: RTF is its wait
    text_only = RequestRecord(start=0.0)
    text_only.on_event(delta(content="x"), 0.2)
    text_only.on_event(DONE, 0.3)
    assert text_only.stall_s is None and text_only.realtime is None
    assert late.summary()["stall_s"] == late.stall_s and late.summary()["realtime"] is False

    s = summarize([rec, late, text_only, RequestRecord(start=0.0, error="HTTP 500")], wall_s=1.0)
    assert s.realtime_frac == pytest.approx(0.5)  # of the successful requests with audio
    assert s.metrics["stall_s"]["n"] == 2
    assert s.metrics["stall_s"]["max"] == pytest.approx(2 * REALTIME_TOLERANCE_S)
    assert summarize([text_only], wall_s=1.0).realtime_frac is None


def test_streams_slower_than_realtime_say_what_made_their_rtf():
    made = [dict(rtf=2.0, audio_s=0.25, ttfa_s=0.5, stall_s=0.0),        # short, never dry
            dict(rtf=1.25, audio_s=8.0, ttfa_s=0.3, stall_s=1.5),        # slow: it waited
            dict(rtf=0.3, audio_s=9.0, ttfa_s=0.2, stall_s=0.0),         # real time
            dict(rtf=None, audio_s=0.0, ttfa_s=None, stall_s=None)]      # text only
    assert slower_than_realtime(made) == (
        "2 of 4 streams: RTF 1.25: 8.00 s of audio, first at 0.300 s, stalled 1.500 s, "
        "RTF 2.00: 0.25 s of audio, first at 0.500 s, stalled 0.000 s")  # longest wait first
    assert slower_than_realtime(made[2:]) is None
    many = [dict(rtf=1.0 + i, audio_s=0.1, ttfa_s=0.5, stall_s=i / 100) for i in range(6)]
    line = slower_than_realtime(many, most=4)
    assert line.startswith("6 of 6 streams: RTF 6.00") and line.endswith(", and 2 more")
    assert line.count("RTF ") == 4


def test_session_34s_rtf_p99_over_one_was_short_answers_that_never_ran_dry():
    """The claim benchmarks/README.md "Session 34" makes of its c=32 level (an H200): the
    streams of RTF >= 1 there carried under half a second of audio and never waited."""
    path = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu_serve_h200_s34.json"
    c8, c32 = json.loads(path.read_text())["levels"]
    assert slower_than_realtime(c8["requests"]) is None
    slow = [r for r in c32["requests"] if r["rtf"] is not None and r["rtf"] >= 1]
    assert slow and all(r["audio_s"] < 0.5 and r["stall_s"] == 0 for r in slow)
    assert slower_than_realtime(c32["requests"]).startswith(f"{len(slow)} of 64 streams: ")


# -- statistics -----------------------------------------------------------------------------------
def test_percentile_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_stats_ignores_none_and_handles_empty():
    s = stats([1.0, None, 3.0])
    assert s["n"] == 2 and s["mean"] == 2.0 and s["p50"] == 2.0
    assert (s["min"], s["max"]) == (1.0, 3.0)
    assert stats([None])["n"] == 0 and stats([])["p99"] is None


def test_summarize_rates_count_only_successful_requests():
    good, bad = stream_record(), RequestRecord(start=0.0, error="HTTP 500")
    s = summarize([good, good, bad], wall_s=4.0)
    assert (s.num_requests, s.num_ok) == (3, 2)
    assert s.requests_per_s == pytest.approx(0.5)
    assert s.output_tokens_per_s == pytest.approx(128 / 4)
    assert s.audio_seconds_per_s == pytest.approx(3.0 / 4)
    assert s.metrics["ttfa"]["p50"] == pytest.approx(0.5)
    assert s.metrics["output_tokens"]["p99"] == 64
    with pytest.raises(ValueError):
        summarize([good], wall_s=0)


def test_output_tokens_are_the_text_tokens():
    """``completion_tokens`` also counts audio tokens (80 ms frames): the benchmarks' output
    tokens are ``completion_tokens_details.text_tokens`` when the server gives them."""
    rec = RequestRecord(start=0.0)
    rec.on_event({"choices": [], "usage": {
        "prompt_tokens": 7, "completion_tokens": 64 + 30, "total_tokens": 101,
        "completion_tokens_details": {"text_tokens": 64, "audio_tokens": 30}}}, 1.0)
    assert (rec.completion_tokens, rec.prompt_tokens) == (64, 7)


def test_mixed_prompts_span_their_range_log_uniformly_and_repeat_with_the_seed():
    from benchmarks.serve_bench import make_prompts

    ps = make_prompts("mixed", 400, 0, seed=3, len_range=(32, 2000))
    words = [len(p.split()) for p in ps]
    assert min(words) >= 32 and max(words) <= 2000
    # log-uniform: about as many prompts in 32-250 words as in 250-2000 (each ~half the log range)
    short = sum(w < 250 for w in words)
    assert 150 < short < 250, short
    assert make_prompts("mixed", 400, 0, seed=3, len_range=(32, 2000)) == ps
    assert [len(p.split()) for p in make_prompts("random", 3, 7, seed=0)] == [7, 7, 7]


# -- compare.py's instruments on the real offline pipeline ----------------------------------------
def test_compare_times_every_offline_stage(tiny_model_dir):
    """``compare.Offline`` wraps the runners' methods and the local pipeline's hops by name:
    when the pipeline core moves them, every stage must still be timed (not silently zero)."""
    from benchmarks.compare import STAGES, Offline

    off = Offline(tiny_model_dir, ["async_chunk"])
    res = off.run("async_chunk", "Hello there.", max_tokens=6, frames=6)
    assert res["output_tokens"] == 6 and res["audio_seconds"] > 0
    calls = res["stage_calls"]
    assert all(calls.get(s, 0) > 0 for s in STAGES), calls
    assert calls["codec_hop"] >= calls["code2wav.decode"]
