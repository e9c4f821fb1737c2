"""End to end over real HTTP with the openai client: modalities, streaming, equality of audio."""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest
from chat_helpers import ask, offline_answer

pytestmark = pytest.mark.slow

MODES = ("async_chunk", "sync")


@pytest.mark.parametrize("mode", MODES)
def test_streamed_audio_equals_nonstreamed_and_offline(serve_urls, offline, mode):
    url = serve_urls[mode]
    text_s, pcm_s, fin_s, usage_s = ask(url, stream=True)
    text_n, pcm_n, fin_n, usage_n = ask(url, stream=False)
    ref_text, ref_pcm = offline_answer(offline[mode])
    assert text_s == text_n == ref_text
    assert pcm_s is not None and pcm_s.size > 0
    assert pcm_s.shape == pcm_n.shape == ref_pcm.shape
    assert np.abs(pcm_s.astype(int) - pcm_n.astype(int)).max() <= 1
    assert np.abs(pcm_s.astype(int) - ref_pcm.astype(int)).max() <= 1
    assert np.abs(ref_pcm).max() > 1000  # audible: the comparison is not between silences
    # completion tokens: the thinker's 16 text tokens plus one audio token per 80 ms frame
    assert usage_s.model_dump() == usage_n.model_dump()
    assert usage_s.completion_tokens_details.text_tokens == 16
    assert usage_s.completion_tokens == 16 + -(-pcm_s.size // 1920)
    assert fin_s == fin_n == "length"


@pytest.mark.parametrize("mode", MODES)
def test_ignore_eos_runs_the_audio_to_max_audio_frames(serve_urls, offline, mode):
    """``ignore_eos`` (vLLM's extension, for benchmarks of fixed lengths): this answer's audio,
    which ends at the codec end after ~19 of its 90 frames, runs to all 90, as the offline
    pipeline's with the same flag; the text keeps its max_tokens."""
    url = serve_urls[mode]
    _, short, _, _ = ask(url, stream=True, max_tokens=30, frames=90)
    assert 0 < short.size < 80 * 1920
    text, pcm, finish, usage = ask(url, stream=True, max_tokens=30, frames=90,
                                   extra={"ignore_eos": True})
    ref_text, ref_pcm = offline_answer(offline[mode], max_tokens=30, frames=90, ignore_eos=True)
    assert text == ref_text and pcm.shape == ref_pcm.shape
    assert np.abs(pcm.astype(int) - ref_pcm.astype(int)).max() <= 1
    assert usage.completion_tokens_details.audio_tokens == 90
    assert usage.completion_tokens_details.text_tokens == 30 and finish == "length"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("modalities", [("text",), ("audio",), ("text", "audio")])
def test_every_modality_combination(serve_urls, mode, stream, modalities):
    text, pcm, finish, usage = ask(serve_urls[mode], modalities=modalities, stream=stream,
                                   max_tokens=8, frames=20)
    assert finish in ("stop", "length")
    assert usage.prompt_tokens > 0 and usage.completion_tokens_details.text_tokens == 8
    audio_tokens = -(-pcm.size // 1920) if pcm is not None else 0
    assert usage.completion_tokens_details.audio_tokens == audio_tokens
    assert usage.completion_tokens == 8 + audio_tokens
    if "text" in modalities:
        assert text
    else:
        assert text is None
    if "audio" in modalities:
        assert pcm is not None and pcm.size > 0
    else:
        assert pcm is None


def test_async_and_sync_apps_agree(serve_urls):
    a = ask(serve_urls["async_chunk"], stream=True, voice="aiden")
    s = ask(serve_urls["sync"], stream=True, voice="aiden")
    assert a[0] == s[0]
    assert a[1].shape == s[1].shape


def test_concurrent_clients_get_their_alone_answers(serve_urls):
    url = serve_urls["async_chunk"]
    prompts = [f"Question number {i}: {'why ' * (i + 1)}?" for i in range(8)]
    voices = ["ethan", "chelsie", "aiden"]
    alone = [ask(url, p, voice=voices[i % 3], stream=True, max_tokens=6 + i, frames=15)
             for i, p in enumerate(prompts)]
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(
            lambda ip: ask(url, ip[1], voice=voices[ip[0] % 3], stream=True, max_tokens=6 + ip[0],
                           frames=15), enumerate(prompts)))
    for a, t in zip(alone, together):
        assert a[0] == t[0]
        assert a[1].shape == t[1].shape
        assert np.abs(a[1].astype(int) - t[1].astype(int)).max() <= 1
