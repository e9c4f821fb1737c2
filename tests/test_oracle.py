"""The offline pipeline against transformers' ``Qwen3OmniMoeForConditionalGeneration.generate()``.

On the tiny checkpoint with greedy decoding, sync mode must give the reference's text token ids,
its codec frames and its waveform (same length, within 1e-5 of the reference's peak). The
reference's frames are read from the ``codes`` argument of its ``code2wav.chunked_decode``.
"""

from __future__ import annotations

import pytest
import torch

from omni_ray.config.request import OmniRequest
from omni_ray.offline import Omni
from omni_ray.payload import FinishReason

# transformers' talker.generate() warns that its repetition penalty skips the prompt (as ours does).
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")

IM_END = 151645

# name -> (user text, system text, speaker, max_tokens, max_audio_frames)
CASES = {
    "max-tokens-chelsie": ("Hello there, how are you?", None, "chelsie", 8, 40),
    "ethan": ("Tell me a story about a cat.", None, "ethan", 8, 40),
    "aiden": ("Hi", None, "aiden", 8, 40),
    "system-turn": ("What is 2+2?", "You are a helpful assistant.", "ethan", 8, 40),
    "codec-eos": ("Hello there, how are you?", None, "chelsie", 16, 59),
    "frames-cut": ("Describe the ocean in three sentences please.", None, "aiden", 8, 12),
    # Fewest tokens the reference handles: with thinker_max_new_tokens=1 transformers 5.24's
    # generate() fails building the talker prompt (8 text vs 9 codec positions).
    "two-tokens": ("Hi", None, "chelsie", 2, 10),
}


@pytest.fixture(scope="module")
def omni(tiny_model_dir) -> Omni:
    return Omni(tiny_model_dir, mode="sync")


def reference(model, ids, *, speaker, max_tokens, max_audio_frames, stop_token_ids=()):
    """(text ids, codec frames [T, 16], waveform) from transformers' generate()."""
    recorded = []
    decode = model.code2wav.chunked_decode

    def record(codes, *args, **kwargs):
        recorded.append(codes.clone())
        return decode(codes, *args, **kwargs)

    extra = {"thinker_eos_token_id": [IM_END, *stop_token_ids]} if stop_token_ids else {}
    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        mp.setattr(model.code2wav, "chunked_decode", record)
        # The talker's last sampled token never becomes a frame: F frames need F + 1 tokens.
        seqs, wav = model.generate(
            torch.tensor([ids]), speaker=speaker, thinker_max_new_tokens=max_tokens,
            thinker_do_sample=False, talker_do_sample=False,
            talker_max_new_tokens=max_audio_frames + 1, **extra)
    (codes,) = recorded  # [1, 16, T]
    return seqs[0, len(ids):].tolist(), codes[0].T, wav.reshape(-1).float()


def assert_same_audio(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    peak = ref.abs().max()
    assert peak > 0
    assert (ours - ref).abs().max() <= 1e-5 * peak


def run_both(omni, reference_model, text, system, speaker, max_tokens, frames, stop=()):
    ids = omni.prompt_ids(text, system=system)
    req = OmniRequest(request_id="oracle", prompt_token_ids=ids, speaker=speaker,
                      max_tokens=max_tokens, max_audio_frames=frames, stop_token_ids=stop)
    (out,) = omni.generate(req)
    ref = reference(reference_model, ids, speaker=speaker, max_tokens=max_tokens,
                    max_audio_frames=frames, stop_token_ids=stop)
    return out, ref


@pytest.mark.parametrize("name", list(CASES))
def test_sync_matches_transformers(omni, reference_model, name):
    text, system, speaker, max_tokens, frames = CASES[name]
    out, (ref_ids, ref_codes, ref_wav) = run_both(omni, reference_model, text, system, speaker,
                                                  max_tokens, frames)
    assert out.text_token_ids == ref_ids
    assert torch.equal(out.codec_frames, ref_codes)
    assert_same_audio(out.audio, ref_wav)
    # What each case is there for.
    assert out.finish_reason == FinishReason.LENGTH and len(ref_ids) == max_tokens
    n = out.codec_frames.shape[0]
    if name == "codec-eos":
        assert n < frames  # the talker ended the speech itself
    elif name == "frames-cut":
        assert n == frames  # max_audio_frames cut it
    assert out.audio.numel() == n * 1920 - 555


def test_system_case_has_a_system_turn(omni):
    """The "system-turn" case above checks that the talker skips system turns as the reference
    does (it keeps user turns only); here, that its prompt really holds one before the user's."""
    with_sys = omni.prompt_ids("What is 2+2?", system="You are a helpful assistant.")
    without = omni.prompt_ids("What is 2+2?")
    assert len(with_sys) > len(without) and with_sys[-len(without):] == without


def test_stop_token_matches_transformers(omni, reference_model):
    text, speaker, max_tokens, frames = "Tell me a story about a cat.", "chelsie", 10, 40
    ids = omni.prompt_ids(text)
    (free,) = omni.generate(OmniRequest(request_id="free", prompt_token_ids=ids, speaker=speaker,
                                        max_tokens=max_tokens, max_audio_frames=frames))
    stop = free.text_token_ids[4]  # the 5th generated token
    out, (ref_ids, ref_codes, ref_wav) = run_both(omni, reference_model, text, None, speaker,
                                                  max_tokens, frames, stop=(stop,))
    assert out.finish_reason == FinishReason.STOP
    assert out.text_token_ids == ref_ids == free.text_token_ids[: ref_ids.index(stop) + 1]
    assert len(out.text_token_ids) <= 5
    assert torch.equal(out.codec_frames, ref_codes)
    assert_same_audio(out.audio, ref_wav)
    # The case has teeth: ending the text early changes the speech. (On random weights the
    # talker often ignores its trailing text; for this prompt and speaker it does not.)
    assert not torch.equal(out.codec_frames, free.codec_frames)
