"""Tests for omni_ray/payload/codec.py: lossless round trips, buffer semantics, strict decoding."""

from __future__ import annotations

import json
import math
import struct
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni_ray.payload import (
    FinishReason,
    PayloadDecodeError,
    PayloadEncodeError,
    PayloadError,
    TextDelta,
    decode,
    encode,
)

# Every plain dtype this torch build has; quantized ones need scale/zero-point and are refused.
ALL_TORCH_DTYPES = sorted(
    {
        dt
        for dt in vars(torch).values()
        if isinstance(dt, torch.dtype) and not str(dt).startswith(("torch.qint", "torch.quint"))
    },
    key=str,
)
# The ones the brief names, checked by name so a missing one fails loudly rather than silently.
NAMED_DTYPES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
]
NUMPY_DTYPES = [
    "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "g", "c8", "c16", "G",
    ">i4", ">f8", ">c16",
]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A tensor of arbitrary bit patterns (nan/inf/denormals included), valid bools for bool."""
    n = math.prod(shape) * dtype.itemsize
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1
    return torch.from_numpy(raw).view(dtype).reshape(shape)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw element bytes in C order (clone: `.contiguous()` keeps the stride of size-1 dims)."""
    if t.numel() == 0:
        return b""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.dtype.itemsize)
    flat = t.detach().view(as_int or t.dtype).reshape(-1)  # int view: shell dtypes cannot copy
    flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).numpy().tobytes()


def assert_same(a: object, b: object) -> None:
    """Exact equality: same types, float bits, and dtype/shape/bytes for tensors and arrays."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b)
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert tensor_bytes(a) == tensor_bytes(b)
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert np.ascontiguousarray(a).tobytes() == b.tobytes()
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


def roundtrip(obj: object) -> object:
    buf = encode(obj)
    out = decode(buf)
    assert_same(obj, out)
    return out


def split(buf: np.ndarray) -> tuple[dict, bytes]:
    """(header dict, data section) of an encoded buffer."""
    n = struct.unpack("<Q", buf[:8].tobytes())[0]
    start = -(-(8 + n) // 64) * 64
    return json.loads(buf[8:8 + n].tobytes()), buf[start:].tobytes()


def join(header: dict, data: bytes) -> bytes:
    """Re-frame an edited header with the original data section."""
    head = json.dumps(header).encode()
    pad = -(8 + len(head)) % 64
    return struct.pack("<Q", len(head)) + head + b"\0" * pad + data


def edited(obj: object, edit) -> bytes:
    header, data = split(encode(obj))
    edit(header)
    return join(header, data)


# ---------------------------------------------------------------- tensors


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_every_torch_dtype_roundtrips_bitwise(dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 warns that it is experimental
        t = random_tensor(dtype, (3, 5))
        # contiguous, transposed, strided, and a size-1 dim that keeps a stride of 3
        roundtrip([t, t.t(), t[:, ::2], t[:1, ::3], t[0, 0]])


@pytest.mark.parametrize("name", NAMED_DTYPES)
def test_named_dtypes_exist_and_roundtrip(name):
    roundtrip(random_tensor(getattr(torch, name), (2, 3, 4)))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (7,), (2, 3), (2, 3, 4), (2, 1, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_shapes_kept_exactly(shape, dtype):
    out = roundtrip(random_tensor(dtype, shape))
    assert out.shape == torch.Size(shape)


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t.t(),
        lambda t: t[:, ::2],
        lambda t: t[1:, 1:3],
        lambda t: t.expand(3, 4, 6)[:, 1],
        lambda t: t[::2].unsqueeze(0).permute(2, 0, 1),
    ],
)
def test_non_contiguous_tensors_are_made_contiguous(view):
    base = random_tensor(torch.float32, (4, 6))
    t = view(base)
    assert not t.is_contiguous()
    out = roundtrip(t)
    assert out.is_contiguous() and torch.equal(out, t)


def test_conj_neg_and_grad_views_are_resolved():
    z = random_tensor(torch.complex64, (3,))
    out = decode(encode(z.conj()))
    assert tensor_bytes(out) == tensor_bytes(z.conj().resolve_conj())
    x = torch.randn(3, requires_grad=True)
    out = decode(encode(x * 2))
    assert not out.requires_grad and torch.equal(out, (x * 2).detach())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_come_back_on_cpu():
    t = random_tensor(torch.bfloat16, (4, 8)).cuda().t()
    out = decode(encode(t))
    assert out.device.type == "cpu" and tensor_bytes(out) == tensor_bytes(t.cpu())


def test_float_specials_survive_in_tensors():
    t = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 5e-324], dtype=torch.float64)
    assert tensor_bytes(decode(encode(t))) == tensor_bytes(t)


def test_quantized_and_sparse_tensors_are_refused():
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    with pytest.raises(PayloadEncodeError, match=r"obj\[0\]"):
        encode([q])
    with pytest.raises(PayloadEncodeError, match="layout"):
        encode(torch.eye(3).to_sparse())


# ---------------------------------------------------------------- numpy


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_dtypes_roundtrip(dtype):
    dt = np.dtype(dtype)
    raw = np.random.default_rng(1).integers(0, 256, size=12 * dt.itemsize, dtype=np.uint8)
    if dt.kind == "b":
        raw &= 1
    roundtrip(raw.view(dt).reshape(3, 4))


@pytest.mark.parametrize(
    "arr",
    [np.zeros(()), np.zeros((0, 3)), np.arange(24).reshape(2, 3, 4)[:, ::2, 1:],
     np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(4.0)[::-1], np.arange(2.0)[::2]],
)
def test_numpy_shapes_and_layouts(arr):
    roundtrip(arr)


@pytest.mark.parametrize("arr", [np.array(["a"]), np.array([object()]), np.zeros(2, "M8[s]"),
                                 np.zeros(2, [("a", "i4")])])
def test_non_numeric_numpy_is_refused(arr):
    with pytest.raises(PayloadEncodeError, match="ndarray dtype"):
        encode({"x": arr})


# ---------------------------------------------------------------- scalars and containers


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 2**63, -(2**64) - 1, 10**5000, -(7**9000), 0.0, -0.0, 1.5,
     float("nan"), -float("nan"), float("inf"), -float("inf"), 5e-324, 1.7976931348623157e308,
     struct.unpack(">d", bytes.fromhex("7ff0000000000001"))[0],  # signalling nan payload
     "", "héllo \u2603 \U0001f600", "\ud800 lone surrogate", "\0 nul", b"", b"\x00\xff" * 100,
     FinishReason.NONE, FinishReason.ERROR],
    ids=lambda v: type(v).__name__,  # repr() of a 5000-digit int raises
)
def test_scalars_roundtrip_exactly(value):
    roundtrip(value)


def test_nested_containers_roundtrip():
    value = {
        "list": [1, [2, [3, []]], ()],
        "tuple": (1, (2.5, "x"), [None]),
        "dict": {"": {}, "nested": {"t": torch.arange(6).reshape(2, 3), "b": b"raw"}},
        "mixed": [torch.zeros(0), np.ones(3, np.float32), (b"", torch.tensor(True))],
        "order": {"z": 1, "a": 2, "m": 3},
    }
    out = roundtrip(value)
    assert list(out["order"]) == ["z", "a", "m"]


def test_shared_objects_are_encoded_twice_not_as_a_cycle():
    shared = [1, 2]
    t = torch.arange(3)
    out = roundtrip([shared, shared, t, t])
    assert out[0] is not out[1]


scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**300), max_value=2**300)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text() | st.binary(max_size=40)
    | st.sampled_from(list(FinishReason))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@FAST
@given(values)
def test_property_any_nested_value_roundtrips(value):
    roundtrip(value)


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from([torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                                  torch.int64, torch.float16, torch.bfloat16, torch.float32,
                                  torch.float64, torch.complex64, torch.float8_e4m3fn]))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    t = random_tensor(dtype, shape, seed=draw(st.integers(0, 2**16)))
    if t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, -1)
    if t.dim() >= 1 and draw(st.booleans()):
        t = t[::2]
    return t


@FAST
@given(st.lists(tensors(), min_size=1, max_size=4))
def test_property_tensors_roundtrip_bitwise(ts):
    roundtrip(ts)


# ---------------------------------------------------------------- buffer forms and memory


def test_encoded_buffer_layout():
    buf = encode({"a": torch.ones(3), "b": b"xy"})
    assert buf.dtype == np.uint8 and buf.ndim == 1 and buf.flags.writeable
    assert buf.ctypes.data % 64 == 0
    header, _ = split(buf)
    assert header["version"] == 1
    for _, node in header["root"]["v"]:
        assert node["off"] % 64 == 0


def test_encoding_is_deterministic():
    value = [torch.arange(5.0), {"x": b"abc"}, 1.5]
    assert encode(value).tobytes() == encode(value).tobytes()


def test_writable_buffer_decodes_zero_copy():
    buf = encode([torch.arange(4, dtype=torch.int64), np.arange(3.0)])
    t, a = decode(buf)
    t[0] = 99
    a[0] = 7.0
    again = decode(buf)
    assert again[0][0] == 99 and again[1][0] == 7.0


@pytest.mark.parametrize("form", [bytes, lambda b: memoryview(bytes(b)), "readonly-ndarray"])
def test_readonly_buffers_give_safe_writable_copies(form):
    buf = encode([torch.arange(4.0), np.arange(3)])
    if form == "readonly-ndarray":
        src = buf.copy()
        src.flags.writeable = False
    else:
        src = form(buf.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when wrapping non-writable memory
        t, a = decode(src)
        t.add_(1)
        a += 1
    assert torch.equal(t, torch.arange(4.0) + 1) and a.tolist() == [1, 2, 3]


def test_bytearray_and_misaligned_buffers_decode():
    value = [torch.arange(5, dtype=torch.float64), torch.ones((), dtype=torch.complex128)]
    assert_same(value, decode(bytearray(encode(value).tobytes())))
    backing = np.zeros(encode(value).size + 1, np.uint8)
    shifted = backing[1:]  # odd address: float64 data must be realigned by a copy
    shifted[:] = encode(value)
    assert_same(value, decode(shifted))


# ---------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    "value, path, typename",
    [
        ({1, 2}, "obj", "set"),
        ([1, object()], r"obj\[1\]", "object"),
        ({"a": {"b": [0, 1.0, {3}]}}, r"obj\['a'\]\['b'\]\[2\]", "set"),
        ((1, bytearray(b"x")), r"obj\[1\]", "bytearray"),
        ([np.float32(1.0)], r"obj\[0\]", "float32"),
        ({"k": FinishReason}, r"obj\['k'\]", "EnumType|EnumMeta"),
    ],
)
def test_unsupported_types_name_type_and_path(value, path, typename):
    with pytest.raises(PayloadEncodeError, match=rf"^{path}: unsupported type .*({typename})"):
        encode(value)


def test_other_enums_and_subclasses_are_refused():
    import collections
    import enum

    class Color(enum.IntEnum):
        RED = 1

    for value in (Color.RED, collections.OrderedDict(a=1), type("MyStr", (str,), {})("x")):
        with pytest.raises(PayloadEncodeError, match="unsupported type"):
            encode(value)


def test_too_deep_nesting_is_an_encode_error():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(PayloadEncodeError, match="nested too deeply"):
        encode(deep)


def test_non_str_dict_keys_are_refused():
    with pytest.raises(PayloadEncodeError, match=r"obj\['a'\]: dict key 1"):
        encode({"a": {1: "x"}})


def test_cycles_are_refused():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(PayloadEncodeError, match=r"obj\[1\]: reference cycle"):
        encode(loop)


def test_errors_share_a_base():
    assert issubclass(PayloadEncodeError, PayloadError)
    assert issubclass(PayloadDecodeError, PayloadError)


# ---------------------------------------------------------------- decode errors


def _set_kind(header):
    header["root"]["v"][1]["k"] = "complex_number"


@pytest.mark.parametrize(
    "edit, match",
    [
        (_set_kind, "unknown kind tag 'complex_number'"),
        (lambda h: h.update(version=2), "unsupported version 2"),
        (lambda h: h.update(version=True), "unsupported version"),
        (lambda h: h.update(format="other"), "not an omni_ray payload"),
        (lambda h: h.update(extra=1), r"unknown keys \['extra'\]"),
        (lambda h: h["root"]["v"][1].update(v="1.5"), "bad hex int"),
        (lambda h: h["root"]["v"][1].update(extra=0), "unknown keys"),
        (lambda h: h["root"]["v"][2].update(off=64), "out of place"),
        (lambda h: h["root"]["v"][2].update(off=10**9), "out of place"),
        (lambda h: h["root"]["v"][2].update(off=-64), "non-negative"),
        (lambda h: h["root"]["v"][2].update(shape=[5]), "blob length"),
        (lambda h: h["root"]["v"][2].update(dtype="float128x"), "unknown torch dtype"),
        (lambda h: h["root"]["v"][2].update(dtype="qint8"), "unknown torch dtype"),
        (lambda h: h["root"]["v"][3].update(t="Color"), "unknown enum"),
        (lambda h: h["root"]["v"][3].update(v=9), "FinishReason"),
        (lambda h: h["root"]["v"][4].update(v="7ff"), "bad float bits"),
        (lambda h: h["root"]["v"][5].update(v=[["a", {"k": "none"}]] * 2), "duplicate dict key"),
        (lambda h: h["root"]["v"][6].update(dtype="O"), "unsupported ndarray dtype"),
        (lambda h: h["root"]["v"].append({"k": "none", "v": 1}), r"obj\[7\]: missing keys"),
        (lambda h: h["root"]["v"].append([]), "kind tag"),
        (lambda h: h.update(nbytes=h["nbytes"] + 64), "truncated"),
    ],
)
def test_hand_edited_headers_raise_decode_error(edit, match):
    value = [None, 5, torch.arange(4, dtype=torch.int32), FinishReason.STOP, 1.0, {"a": None},
             np.arange(2)]
    with pytest.raises(PayloadDecodeError, match=match):
        decode(edited(value, edit))


def test_unreferenced_data_is_an_error():
    def drop_tensor(h):
        h["root"]["v"].pop()

    with pytest.raises(PayloadDecodeError, match="unreferenced"):
        decode(edited([1, torch.ones(2)], drop_tensor))


def test_every_truncation_and_trailing_bytes_raise():
    buf = encode({"t": torch.arange(10), "s": "text"}).tobytes()
    for n in range(len(buf)):
        with pytest.raises(PayloadDecodeError):
            decode(buf[:n])
    with pytest.raises(PayloadDecodeError, match="trailing bytes"):
        decode(buf + b"\0")


@pytest.mark.parametrize("bad", [np.zeros((2, 64), np.uint8), np.zeros(64, np.int32), "text", 5])
def test_wrong_buffer_types_raise(bad):
    with pytest.raises(PayloadDecodeError):
        decode(bad)


def test_garbage_header_raises():
    for head in (b"not json", b"\xff\xfe", b"[1, 2]", b'{"format": 1}'):
        buf = struct.pack("<Q", len(head)) + head
        with pytest.raises(PayloadDecodeError):
            decode(buf + b"\0" * (-len(buf) % 64))


@FAST
@given(st.data())
def test_property_corrupted_buffers_decode_or_raise_decode_error(data):
    value = [TextDelta(request_id="r", seq=1, token_ids=[3, 4]), torch.arange(6.0), {"k": b"v"}]
    buf = bytearray(encode(value).tobytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(buf))
    except PayloadDecodeError:
        pass
