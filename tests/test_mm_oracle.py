"""Audio and image input against transformers' ``generate()`` on the tiny checkpoint.

The offline pipeline, in both delivery modes, must give the reference's text tokens, codec frames
and waveform (within 1e-5 of its peak) for prompts with an audio clip, an image, and both. The
reference gets the same processor output; the negative controls show the comparison can fail:
without the thinker's hidden states (or with the talker's text-only positions) the frames differ.
"""

from __future__ import annotations

import pytest
import torch
from media_samples import audio_bytes, picture, tone

from omni_ray.inputs.audio import decode_audio
from omni_ray.models.tokenizer import chat_prompt
from omni_ray.offline import Omni

pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")

MAX_TOKENS, FRAMES = 10, 40


def messages(kind: str) -> list[dict]:
    parts = []
    if kind in ("audio", "both"):
        # through the request path's decoder: 24 kHz wav -> 16 kHz float32
        parts.append({"type": "audio", "audio": decode_audio(audio_bytes(tone(1.5)), "wav",
                                                             max_seconds=10)})
    if kind in ("image", "both"):
        parts.append({"type": "image", "image": picture(96, 64)})
    parts.append({"type": "text", "text": "What do you hear and see?"})
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def pipelines(tiny_model_dir):
    return {m: Omni(tiny_model_dir, mode=m) for m in ("sync", "async_chunk")}


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir, local_files_only=True)


def reference(model, processor, msgs):
    """(prompt ids, text ids, frames [T, 16], waveform) from transformers' generate()."""
    audios = [p["audio"] for p in msgs[1]["content"] if p["type"] == "audio"]
    images = [p["image"] for p in msgs[1]["content"] if p["type"] == "image"]
    inputs = processor(text=chat_prompt(msgs), audio=audios or None, images=images or None,
                       return_tensors="pt")
    recorded = []
    decode = model.code2wav.chunked_decode

    def record(codes, *args, **kwargs):
        recorded.append(codes.clone())
        return decode(codes, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        mp.setattr(model.code2wav, "chunked_decode", record)
        # transformers 5.24's talker mrope reads config.audio_config, which only the thinker has
        mp.setattr(model.talker.config, "audio_config", model.thinker.config.audio_config,
                   raising=False)
        seqs, wav = model.generate(**inputs, speaker="ethan", thinker_max_new_tokens=MAX_TOKENS,
                                   thinker_do_sample=False, talker_do_sample=False,
                                   talker_max_new_tokens=FRAMES + 1)
    ids = inputs["input_ids"][0].tolist()
    return ids, seqs[0, len(ids):].tolist(), recorded[0][0].T, wav.reshape(-1).float()


@pytest.fixture(scope="module")
def references(reference_model, processor):
    return {k: reference(reference_model, processor, messages(k))
            for k in ("audio", "image", "both")}


@pytest.mark.parametrize("mode", ["sync", "async_chunk"])
@pytest.mark.parametrize("kind", ["audio", "image", "both"])
def test_media_prompt_matches_transformers(pipelines, references, kind, mode):
    omni = pipelines[mode]
    ref_prompt, ref_text, ref_frames, ref_wav = references[kind]
    req = omni.request(messages(kind), request_id=f"mm-{kind}", speaker="ethan",
                       max_tokens=MAX_TOKENS, max_audio_frames=FRAMES)
    assert req.prompt_token_ids == ref_prompt and req.mm is not None
    (out,) = omni.generate(req)
    assert out.text_token_ids == ref_text
    assert torch.equal(out.codec_frames, ref_frames)
    assert out.audio.shape == ref_wav.shape
    assert (out.audio - ref_wav).abs().max() <= 1e-5 * ref_wav.abs().max()


def test_text_only_output_of_a_media_prompt(pipelines, references):
    _, ref_text, _, _ = references["both"]
    req = pipelines["sync"].request(messages("both"), request_id="mm-text", modalities=("text",),
                                    max_tokens=MAX_TOKENS)
    (out,) = pipelines["sync"].generate(req)
    assert out.text_token_ids == ref_text and out.audio.numel() == 0


def test_media_changes_the_answer(pipelines, references):
    """The encoders' output reaches the thinker: the same text without media answers otherwise."""
    omni = pipelines["sync"]
    plain = [{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": "What do you hear and see?"}]
    (out,) = omni.generate(omni.request(plain, request_id="plain", modalities=("text",),
                                        max_tokens=MAX_TOKENS))
    assert out.text_token_ids != references["both"][1]


@pytest.mark.parametrize("broken", ["no-mm-positions", "zero-hidden"])
def test_talker_conditioning_is_checked(pipelines, references, broken):
    """Negative controls: the talker's multimodal inputs matter to the frames the test compares."""
    from omni_ray.runners.transformers import talker as talker_mod

    omni = pipelines["sync"]
    _, _, ref_frames, _ = references["both"]
    req = omni.request(messages("both"), request_id=f"broken-{broken}", speaker="ethan",
                       max_tokens=MAX_TOKENS, max_audio_frames=FRAMES)
    with pytest.MonkeyPatch.context() as mp:
        if broken == "no-mm-positions":
            mp.setattr(talker_mod.TalkerRunner, "_mm_positions", lambda self, seq, n: None)
        else:
            push = talker_mod.TalkerRunner.push_text

            def zeroed(self, rid, ids, finished, prompt=None, hidden=None, *rest):
                hidden = torch.zeros_like(hidden) if hidden is not None else None
                return push(self, rid, ids, finished, prompt, hidden, *rest)

            mp.setattr(talker_mod.TalkerRunner, "push_text", zeroed)
        (out,) = omni.generate(req)
    n = min(len(out.codec_frames), len(ref_frames))
    assert not torch.equal(out.codec_frames[:n], ref_frames[:n])
