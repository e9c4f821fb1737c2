"""Tests for omni_ray/payload/chunks.py: defaults, validate(), chunk round trips via the codec."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_ray.payload import (
    CHUNK_TYPES,
    AudioChunk,
    CodecChunk,
    FinishReason,
    PayloadDecodeError,
    PayloadEncodeError,
    PayloadError,
    TextDelta,
    ThinkerChunk,
    decode,
    decode_chunk,
    encode,
    encode_chunk,
)


def thinker(**kw) -> ThinkerChunk:
    base = dict(request_id="req-1", seq=0, token_ids=[1, 2, 3], prompt_token_ids=[9, 8],
                mm_hidden=torch.randn(4, 16).to(torch.bfloat16))
    return ThinkerChunk(**{**base, **kw})


def codec(**kw) -> CodecChunk:
    base = dict(request_id="req-1", seq=2, start_frame=8, codes=torch.randint(0, 2048, (4, 16)))
    return CodecChunk(**{**base, **kw})


def audio(**kw) -> AudioChunk:
    base = dict(request_id="req-1", seq=1, start_sample=1920, samples=torch.randn(1920))
    return AudioChunk(**{**base, **kw})


def text(**kw) -> TextDelta:
    base = dict(request_id="req-1", seq=0, token_ids=[5], num_prompt_tokens=12)
    return TextDelta(**{**base, **kw})


def assert_same_chunk(a, b) -> None:
    """Field-wise exact equality; tensors compared by dtype, shape and bytes."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert (x.dtype, x.shape) == (y.dtype, y.shape), f.name
            assert tensor_bytes(x) == tensor_bytes(y), f.name  # bitwise: nan != nan otherwise
        else:
            assert type(x) is type(y) and x == y, f.name


def tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def edited(chunk, edit) -> bytes:
    """Encode `chunk`, apply `edit` to its JSON header, and re-frame it with the data section."""
    buf = encode_chunk(chunk)
    n = struct.unpack("<Q", buf[:8].tobytes())[0]
    header = json.loads(buf[8:8 + n].tobytes())
    data = buf[-(-(8 + n) // 64) * 64:].tobytes()
    edit(header)
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"\0" * (-(8 + len(head)) % 64) + data


# ---------------------------------------------------------------- the types


def test_package_imports_neither_ray_nor_the_rest_of_omni_ray():
    code = (
        "import sys, omni_ray.payload; "
        "bad = [m for m in sys.modules if m == 'ray' or m.startswith('ray.') or "
        "(m.startswith('omni_ray.') and not m.startswith('omni_ray.payload'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_chunk_types_registry_and_finish_reason_values():
    assert CHUNK_TYPES == {c.__name__: c for c in (ThinkerChunk, CodecChunk, AudioChunk, TextDelta)}
    assert [(r.name, int(r)) for r in FinishReason] == [
        ("NONE", 0), ("STOP", 1), ("LENGTH", 2), ("ABORT", 3), ("ERROR", 4)
    ]


def test_defaults():
    t = ThinkerChunk(request_id="r", seq=0, token_ids=[])
    assert (t.finished, t.finish_reason, t.prompt_token_ids, t.mm_hidden) == (
        False, FinishReason.NONE, None, None
    )
    a = AudioChunk(request_id="r", seq=0, start_sample=0, samples=torch.zeros(0))
    assert a.sample_rate == 24000
    assert TextDelta(request_id="r", seq=0, token_ids=[]).num_prompt_tokens == 0
    for chunk in (t, a, codec(), text()):
        chunk.validate()


def test_keyword_only_and_slotted():
    with pytest.raises(TypeError):
        TextDelta("r", 0, [])  # type: ignore[misc]
    chunk = text()
    with pytest.raises(AttributeError):
        chunk.finshed = True  # typo must not silently add an attribute


def test_text_delta_compares_by_value():
    assert text() == text() and text() != text(seq=1)


# ---------------------------------------------------------------- validate()


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: text(request_id=""), "request_id"),
        (lambda: text(request_id=7), "request_id"),
        (lambda: text(seq=-1), "seq"),
        (lambda: text(seq=True), "seq"),
        (lambda: text(seq=1.0), "seq"),
        (lambda: text(token_ids=(1, 2)), "token_ids"),
        (lambda: text(token_ids=[1, "2"]), "token_ids[1]"),
        (lambda: text(token_ids=[1, -5]), "token_ids[1]"),
        (lambda: text(token_ids=[np.int64(3)]), "token_ids[0]"),
        (lambda: text(finished=1), "finished"),
        (lambda: text(finish_reason=1, finished=True), "finish_reason"),
        (lambda: text(finish_reason=FinishReason.STOP), "finish_reason"),
        (lambda: text(num_prompt_tokens=-1), "num_prompt_tokens"),
        (lambda: thinker(prompt_token_ids=[1, None]), "prompt_token_ids[1]"),
        (lambda: thinker(seq=1), "prompt_token_ids"),
        (lambda: thinker(seq=1, prompt_token_ids=None), "mm_hidden"),
        (lambda: thinker(mm_hidden=torch.zeros(4, dtype=torch.bfloat16)), "mm_hidden"),
        (lambda: thinker(mm_hidden=torch.zeros(2, 4, dtype=torch.int64)), "mm_hidden"),
        (lambda: thinker(mm_hidden=np.zeros((2, 4), np.float32)), "mm_hidden"),
        (lambda: codec(codes=torch.zeros(4, dtype=torch.int64)), "codes"),
        (lambda: codec(codes=torch.zeros(4, 16, dtype=torch.int32)), "codes"),
        (lambda: codec(codes=torch.zeros(1, 4, 16, dtype=torch.int64)), "codes"),
        (lambda: codec(codes=np.zeros((4, 16), np.int64)), "codes"),
        (lambda: codec(codes=torch.zeros(4, 16, dtype=torch.int64, device="meta")), "codes"),
        (lambda: codec(start_frame=-1), "start_frame"),
        (lambda: audio(samples=torch.zeros(10, dtype=torch.float64)), "samples"),
        (lambda: audio(samples=torch.zeros(1, 10)), "samples"),
        (lambda: audio(samples=torch.zeros(10).to_sparse()), "samples"),
        (lambda: audio(start_sample=-1), "start_sample"),
        (lambda: audio(sample_rate=0), "sample_rate"),
    ],
)
def test_validate_names_the_bad_field(make, field):
    chunk = make()
    with pytest.raises(PayloadError) as info:
        chunk.validate()
    assert info.value.path == field
    assert str(info.value).startswith(f"{field}: ")
    with pytest.raises(PayloadEncodeError, match="^" + re.escape(f"chunk.{field}: invalid")):
        encode_chunk(chunk)


def test_prompt_context_allowed_on_chunk_zero_only_and_finish_on_last():
    thinker().validate()
    thinker(seq=3, prompt_token_ids=None, mm_hidden=None).validate()
    text(finished=True, finish_reason=FinishReason.LENGTH).validate()
    text(finished=True).validate()  # a reason is recommended on the last chunk, not required


def test_any_float_dtype_is_accepted_for_mm_hidden():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn):
        chunk = thinker(mm_hidden=torch.zeros(2, 8).to(dtype))
        chunk.validate()
        assert decode_chunk(encode_chunk(chunk)).mm_hidden.dtype == dtype


# ---------------------------------------------------------------- codec round trips


@pytest.mark.parametrize(
    "chunk",
    [
        thinker(),
        thinker(seq=4, token_ids=[], prompt_token_ids=None, mm_hidden=None, finished=True,
                finish_reason=FinishReason.STOP),
        thinker(mm_hidden=torch.zeros(0, 16)),
        codec(),
        codec(codes=torch.zeros(0, 16, dtype=torch.int64), finished=True,
              finish_reason=FinishReason.ABORT),
        codec(codes=torch.randint(0, 9, (8, 32))[::2, ::2]),  # non-contiguous
        audio(),
        audio(samples=torch.tensor([float("nan"), -0.0, float("inf")]), sample_rate=16000),
        text(),
        text(token_ids=[], finished=True, finish_reason=FinishReason.ERROR),
    ],
    ids=lambda c: type(c).__name__,
)
def test_chunks_roundtrip(chunk):
    out = decode_chunk(encode_chunk(chunk), expected_type=type(chunk))
    assert_same_chunk(chunk, out)
    assert_same_chunk(chunk, decode(encode(chunk)))


def test_chunks_nested_in_containers_roundtrip():
    batch = {"chunks": [thinker(), codec(), audio(), text()], "n": 4}
    out = decode(encode(batch))
    for a, b in zip(batch["chunks"], out["chunks"]):
        assert_same_chunk(a, b)


@settings(max_examples=40, deadline=None)
@given(
    frames=st.integers(0, 12),
    groups=st.integers(1, 32),
    seq=st.integers(0, 2**40),
    start=st.integers(0, 2**62),
    reason=st.sampled_from(list(FinishReason)),
    request_id=st.text(min_size=1, max_size=20),
)
def test_property_codec_chunks_roundtrip(frames, groups, seq, start, reason, request_id):
    chunk = CodecChunk(
        request_id=request_id, seq=seq, start_frame=start,
        codes=torch.randint(-(2**62), 2**62, (frames, groups)),
        finished=reason is not FinishReason.NONE, finish_reason=reason,
    )
    assert_same_chunk(chunk, decode_chunk(encode_chunk(chunk), CodecChunk))


@settings(max_examples=40, deadline=None)
@given(
    token_ids=st.lists(st.integers(0, 2**31), max_size=50),
    prompt=st.none() | st.lists(st.integers(0, 2**31), max_size=50),
    n_mm=st.none() | st.integers(0, 5),
)
def test_property_thinker_chunks_roundtrip(token_ids, prompt, n_mm):
    mm = None if n_mm is None else torch.randn(n_mm, 8).to(torch.bfloat16)
    chunk = ThinkerChunk(request_id="r", seq=0, token_ids=token_ids, prompt_token_ids=prompt,
                         mm_hidden=mm)
    assert_same_chunk(chunk, decode_chunk(encode_chunk(chunk), ThinkerChunk))


# ---------------------------------------------------------------- decode-side errors


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda h: h["root"]["f"].pop("finished"), r"missing keys \['finished'\]"),
        (lambda h: h["root"]["f"].update(extra={"k": "none"}), r"unknown keys \['extra'\]"),
        (lambda h: h["root"].update(t="VideoChunk"), "unknown chunk type 'VideoChunk'"),
        (lambda h: h["root"]["f"]["seq"].update(v="-1"), r"^obj\.seq: invalid TextDelta"),
        (lambda h: h["root"]["f"].update(finish_reason={"k": "int", "v": "1"}),
         r"^obj\.finish_reason: invalid TextDelta"),
        (lambda h: h["root"]["f"]["token_ids"].update(k="tuple"), r"^obj\.token_ids: invalid"),
    ],
)
def test_decode_rejects_bad_chunk_headers(edit, match):
    with pytest.raises(PayloadDecodeError, match=match):
        decode_chunk(edited(text(), edit))


def test_decode_chunk_checks_types():
    with pytest.raises(PayloadDecodeError, match="expected CodecChunk, got TextDelta"):
        decode_chunk(encode_chunk(text()), expected_type=CodecChunk)
    with pytest.raises(PayloadDecodeError, match="expected a chunk"):
        decode_chunk(encode([text()]))


def test_encode_chunk_rejects_non_chunks():
    with pytest.raises(PayloadEncodeError, match="chunk: expected a chunk type"):
        encode_chunk({"request_id": "r"})  # type: ignore[arg-type]


def test_bad_chunk_inside_a_container_reports_full_path():
    with pytest.raises(PayloadEncodeError, match=r"^obj\['batch'\]\[1\]\.seq: invalid TextDelta"):
        encode({"batch": [text(), text(seq=-2)]})
