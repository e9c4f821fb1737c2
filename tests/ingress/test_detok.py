"""The streamed text equals the one-shot decode (issue 20: incremental detokenization)."""

from __future__ import annotations

import random

import pytest

from omni_ray.ingress.detok import Detokenizer
from omni_ray.models.tokenizer import load_tokenizer

TEXTS = ["plain ascii, spaces  and\ttabs\nnewlines", "héllo wörld ñ ç ß", "日本語のテキストと中文",
         "split characters: 𓀀🫠🦩𝔘ꙮ",
         "emoji 🎉👍🏽 family 👨‍👩‍👧 flags 🇯🇵", "mixed: Ωμέγα + العربية + हिन्दी", ""]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def stream(tok, ids: list[int], sizes) -> tuple[list[str], str]:
    d, deltas, i = Detokenizer(tok), [], 0
    while i < len(ids):
        n = next(sizes)
        deltas.append(d.add(ids[i:i + n], final=i + n >= len(ids)))
        i += n
    if not ids:
        deltas.append(d.add([], final=True))
    assert "".join(deltas) == d.text
    return deltas, d.text


def ones():
    while True:
        yield 1


def randoms(seed):
    r = random.Random(seed)
    while True:
        yield r.randint(1, 7)


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_equals_one_shot(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    deltas, got = stream(tok, ids, ones())
    assert got == tok.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in d for d in deltas)  # a split character is held back, not mangled


def test_special_tokens_are_skipped_as_one_shot(tok):
    special = [tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")]
    assert all(isinstance(s, int) and s >= 0 for s in special)
    ids = []
    for i, text in enumerate(TEXTS):
        ids += tok.encode(text, add_special_tokens=False) + [special[i % 3]]
    want = tok.decode(ids, skip_special_tokens=True)
    assert "<|im_end|>" not in want and "日本語" in want
    for sizes in (ones(), randoms(0), randoms(1)):
        assert stream(tok, ids, sizes)[1] == want


def test_random_ids_and_a_dangling_byte_equal_one_shot(tok):
    """Byte-level pieces in any order (invalid UTF-8 in the middle, a partial character at the
    end): the streamed text is still the one-shot decode, U+FFFD where it has one."""
    r = random.Random(0)
    vocab = len(tok)
    for _ in range(30):
        ids = [r.randrange(vocab) for _ in range(r.randint(1, 60))]
        assert stream(tok, ids, randoms(r.random()))[1] == tok.decode(ids, skip_special_tokens=True)
    ids = tok.encode("ab𓀀", add_special_tokens=False)
    split = tok.encode("ab", add_special_tokens=False)
    assert len(ids) > len(split) + 1  # the hieroglyph is three byte-level tokens
    cut = ids[:-1]                    # the answer ends inside it
    assert stream(tok, cut, ones())[1] == tok.decode(cut, skip_special_tokens=True)
