"""Answers for gpu_check.py: one chat request through the openai client, the offline pipeline's
answer to the same, their comparison (with the bfloat16 allowance) and a well-formedness check."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np

from benchmarks.client import spoken_question

SAMPLES_PER_FRAME = 1920  # one 80 ms codec frame at 24 kHz
# code2wav's causal convolutions hold back 555 samples: N frames -> N * 1920 - 555 samples
# (README.md "Delivery modes", omni_ray/runners/transformers/code2wav_stream.py), streamed or not.
WITHHELD_SAMPLES = 555
# bfloat16 allowance (benchmarks/README.md, "GPU check", "Parity allowance"): bf16 moves
# near-tied argmaxes of random weights, so the app (vLLM, compiled) and transformers may part
# after a while; the first this many text tokens must agree. float32 must be exact (text) and
# within PCM16_LSB (audio).
BF16_MIN_EQUAL_TEXT_TOKENS = 8
PCM16_LSB = 1
PROMPT = "Tell me about the sea in a few words."
QUESTION = "What do you hear?"
SPEECH = "The sea is calm tonight."  # /v1/audio/speech's input: voiced as given, no thinker step


def ask(url: str, *, audio_in: bytes | None = None, audio: bool = True, stream: bool = False,
        speech: str | None = None, max_tokens: int, frames: int, model: str = "qwen3-omni"
        ) -> dict:
    """One chat completion through the openai client: text, pcm16 (int16 array or None),
    finish_reason, completion_tokens. ``speech``: ``/v1/audio/speech`` voicing that text instead
    (raw pcm streamed; no text, so ``text`` is "")."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    if speech is not None:
        with client.audio.speech.with_streaming_response.create(
                model=model, input=speech, voice="ethan", response_format="pcm",
                extra_body={"max_audio_frames": frames}) as r:
            pcm = np.frombuffer(r.read(), dtype="<i2")
        return dict(text="", pcm=pcm if pcm.size else None, finish=None, tokens=None)
    content: list | str = PROMPT
    if audio_in is not None:
        content = [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(audio_in).decode(), "format": "wav"}},
            {"type": "text", "text": QUESTION}]
    kw = dict(model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": content}],
              modalities=["text", "audio"] if audio else ["text"],
              extra_body={"max_audio_frames": frames})
    if audio:
        kw["audio"] = {"voice": "ethan", "format": "pcm16" if stream else "wav"}
    if not stream:
        r = client.chat.completions.create(**kw)
        msg, pcm = r.choices[0].message, None
        if msg.audio is not None:
            with wave.open(io.BytesIO(base64.b64decode(msg.audio.data))) as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return dict(text=msg.content or "", pcm=pcm, finish=r.choices[0].finish_reason,
                    tokens=_text_tokens(r.usage))
    text, pcm, finish, tokens = [], [], None, None
    for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                             **kw):
        tokens = _text_tokens(ch.usage) if ch.usage else tokens
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        finish = ch.choices[0].finish_reason or finish
        text.append(d.content or "")
        a = getattr(d, "audio", None) or (d.model_extra or {}).get("audio")
        data = a.get("data") if isinstance(a, dict) else getattr(a, "data", None)
        if data:
            pcm.append(np.frombuffer(base64.b64decode(data), dtype="<i2"))
    return dict(text="".join(text), pcm=np.concatenate(pcm) if pcm else None, finish=finish,
                tokens=tokens)


def cases(has_processor: bool) -> dict:
    """name -> ask() keywords: (a) text only, (b) text + audio streamed / wav, (c) speech out
    (``/v1/audio/speech``), (d) speech in."""
    out = {"text": dict(audio=False), "audio-stream": dict(stream=True),
           "audio-wav": dict(stream=False), "speech-out": dict(speech=SPEECH)}
    if has_processor:
        out["speech-in"] = dict(audio_in=spoken_question(1.5), stream=True)
    return out


def _text_tokens(usage) -> int | None:
    """The thinker's text tokens of an answer: ``completion_tokens`` also counts audio tokens."""
    if usage is None:
        return None
    details = usage.completion_tokens_details
    if details is not None and details.text_tokens is not None:
        return details.text_tokens
    return usage.completion_tokens


def offline_answers(model_dir: str, device: str, pipeline: dict, todo: dict, max_tokens: int,
                    frames: int, dtype: str | None = None) -> dict:
    """The offline transformers pipeline's greedy answer to each case: text, pcm16 int16, the
    text's token ids and each one's top-two logit margin with its bf16 bound (``margins``)."""
    import torch

    from benchmarks.thinker_margins import recording_margins
    from omni_ray.audio import to_pcm16
    from omni_ray.config.pipeline import PipelineConfig
    from omni_ray.config.request import OmniRequest
    from omni_ray.inputs.audio import decode_audio
    from omni_ray.offline import Omni

    dtype = getattr(torch, dtype) if dtype else (
        torch.float32 if device == "cpu" else torch.bfloat16)
    omni = Omni(model_dir, mode=pipeline.get("mode", "async_chunk"), device=device, dtype=dtype,
                pipeline=PipelineConfig(**pipeline))
    out = {}
    for name, kw in todo.items():
        fields = dict(request_id=name, max_tokens=max_tokens, max_audio_frames=frames,
                      speaker="ethan",
                      modalities=("text", "audio") if kw.get("audio", True) else ("text",))
        if kw.get("speech") is not None:  # as the app's /v1/audio/speech builds it
            req = omni.speech_request(kw["speech"], **{**fields, "max_tokens": 4096})
            req = req.model_copy(update={"max_tokens": len(req.answer_token_ids)})
        elif kw.get("audio_in") is None:
            req = OmniRequest(prompt_token_ids=omni.prompt_ids(PROMPT), **fields)
        else:
            speech = decode_audio(kw["audio_in"], "wav", max_seconds=300)
            req = omni.request([{"role": "user", "content": [
                {"type": "audio", "audio": speech}, {"type": "text", "text": QUESTION}]}],
                **fields)
        with recording_margins() as margins:  # where the reference itself is a near-tie
            o = omni.generate(req)[0]
        pcm = np.frombuffer(to_pcm16(o.audio), dtype="<i2") if o.audio.numel() else None
        text = "" if kw.get("speech") is not None else o.text  # the speech API returns no text
        out[name] = dict(text=text, pcm=pcm, frames=int(o.codec_frames.shape[0]),
                         token_ids=list(o.text_token_ids), margins=list(margins))
    omni.shutdown()
    del omni
    if device != "cpu":
        torch.cuda.empty_cache()
    return out


def compare_answers(ref: dict, got: dict, tokenize, exact: bool) -> dict:
    """``got`` (the app's) against ``ref`` (offline): first differing text token and 80 ms frame,
    PCM max |diff|. ``exact`` (float32): same text, same length, PCM within ``PCM16_LSB``; else
    (bfloat16) the first ``BF16_MIN_EQUAL_TEXT_TOKENS`` text tokens equal, or the texts part
    sooner at a token where ``ref`` itself was a near-tie (its top-two margin within one bf16
    step, ``thinker_margins.BF16_BOUND``: ``ref_margin_at_diff``; ``ref`` with ``token_ids`` and
    ``margins``)."""
    rt, gt = tokenize(ref["text"]), tokenize(got["text"])
    first_tok = next((i for i, (a, b) in enumerate(zip(rt, gt)) if a != b), min(len(rt), len(gt)))
    if first_tok == len(rt) == len(gt):
        first_tok = None
    res = dict(text_tokens=len(rt), first_text_diff=first_tok, same_text=ref["text"] == got["text"])
    rp, gp = ref.get("pcm"), got.get("pcm")
    audio_ok = (rp is None) == (gp is None)
    if rp is not None and gp is not None:
        n = min(len(rp), len(gp))
        diff = np.abs(rp[:n].astype(np.int32) - gp[:n].astype(np.int32))
        bad = np.nonzero(diff > PCM16_LSB)[0]
        first_frame = int(bad[0]) // SAMPLES_PER_FRAME if bad.size else (
            None if len(rp) == len(gp) else n // SAMPLES_PER_FRAME)
        res.update(ref_samples=len(rp), samples=len(gp), pcm_max_diff=int(diff.max(initial=0)),
                   first_frame_diff=first_frame)
        audio_ok = first_frame is None
    if exact:
        res["ok"] = res["same_text"] and audio_ok
    else:
        tie = near_tie_at(ref, rt, first_tok)
        if tie is not None:
            res["ref_margin_at_diff"] = tie
        res["ok"] = (res["same_text"] or (first_tok or 0) >= BF16_MIN_EQUAL_TEXT_TOKENS
                     or bool(tie and tie[0] <= tie[1]))
    return res


def near_tie_at(ref: dict, ref_tokens: list[int], index: int | None) -> tuple[float, float] | None:
    """(margin, bf16 bound) of ``ref``'s token ``index`` as it was sampled, where the text's
    tokens are the ones sampled (re-tokenizing may merge them otherwise: then None)."""
    margins, ids = ref.get("margins"), ref.get("token_ids")
    if index is None or not margins or ids is None or index >= len(margins):
        return None
    if list(ids[:index + 1]) != list(ref_tokens[:index + 1]):
        return None
    return tuple(round(x, 6) for x in margins[index])


def audio_frames(samples: int) -> float:
    """The codec frames that ``samples`` PCM samples came from (whole when well-formed)."""
    return (samples + WITHHELD_SAMPLES) / SAMPLES_PER_FRAME


def well_formed(ans: dict, frames: int, audio: bool, text: bool = True) -> tuple[bool, str]:
    """Non-empty text (or finish 'length'; ``text=False``: the speech API, which has none); audio
    from a whole number of frames, 1..``frames``."""
    problems = []
    if text and not ans["text"] and ans["finish"] != "length":
        problems.append(f"empty text, finish={ans['finish']}")
    if audio:
        n = 0 if ans["pcm"] is None else len(ans["pcm"])
        f = audio_frames(n) if n else 0
        if not (f == int(f) and 1 <= f <= frames):
            problems.append(f"{n} samples is not N * {SAMPLES_PER_FRAME} - {WITHHELD_SAMPLES} "
                            f"for N in 1..{frames}")
    return not problems, "; ".join(problems)
