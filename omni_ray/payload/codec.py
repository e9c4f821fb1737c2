"""Lossless binary codec for payloads: one contiguous uint8 buffer per value.

Layout (all offsets in bytes)::

    [0, 8)              header length H, unsigned little-endian
    [8, 8 + H)          UTF-8 JSON header: {"format", "version", "nbytes", "root"}
    [D, D + nbytes)     data section, D = 8 + H rounded up to 64; each tensor / ndarray / bytes
                        blob starts 64-byte aligned, in the order the header walks them

`root` is a tree of nodes, each tagged with its kind `k` (see `_Encoder.value`). Scalars live in
the header; array-like bytes live in the data section, so big tensors are copied once on encode and
not at all on decode. Ints are hex strings (no size limit; Python caps *decimal* int parsing at
4300 digits) and floats are their IEEE-754 bit pattern in hex, so nan payloads, inf and -0.0
survive exactly.

Decoding is strict: an unknown kind, chunk type, field set, version, a truncated buffer, trailing
bytes, or an offset that is not where the canonical layout puts it raises `PayloadDecodeError`.
Tensors always come back on the CPU, detached, as plain `torch.Tensor`.

Memory: when the input buffer is writable (a fresh `encode()` result, a bytearray), decoded
tensors and arrays are zero-copy views of it and keep it alive; do not reuse the buffer while they
are in use. When it is read-only (bytes, a Ray object-store array), each one is copied once,
because torch does not enforce read-only memory and an in-place op on a view would write into (or
crash on) memory that the owner considers immutable.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import struct

import numpy as np
import torch

from omni_ray.payload.chunks import CHUNK_TYPES, Chunk, FinishReason
from omni_ray.payload.errors import PayloadDecodeError, PayloadEncodeError, PayloadError
from omni_ray.payload.kv import KVChunk

FORMAT = "omni_ray.payload"
VERSION = 1
ALIGN = 64  # blob alignment: a cache line, enough for any dtype and SIMD loads

# dtype name (as in `torch.<name>`) -> dtype, for every plain torch dtype this build has
# (bfloat16, float8 variants, complex32, uint16..64, sub-byte shells, ...). Quantized dtypes are
# left out: their bytes mean nothing without scale/zero-point, which a plain tensor lacks.
_TORCH_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in vars(torch).values()
    if isinstance(dt, torch.dtype) and not str(dt).startswith(("torch.qint", "torch.quint"))
}
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: fixed-size numeric data
_ENUM_TYPES: dict[str, type[enum.IntEnum]] = {"FinishReason": FinishReason}
# Every chunk-like type the codec encodes: the stage-edge chunks plus the KV-transfer payload.
CODEC_TYPES: dict[str, type] = {**CHUNK_TYPES, KVChunk.__name__: KVChunk}
_HEX_INT = re.compile(r"-?[0-9a-f]+")  # format(n, "x")
_FLOAT_BITS = re.compile(r"[0-9a-f]{16}")  # struct.pack(">d", x).hex()


def encode(obj: object) -> np.ndarray:
    """Encode `obj` to a fresh, writable, 64-byte aligned 1-D uint8 array.

    Raises `PayloadEncodeError` (with the path, e.g. `obj['x'][3]`) for unsupported types,
    non-str dict keys, cycles and chunks whose `validate()` fails.
    """
    return _encode(obj, root="obj")


def decode(buf: np.ndarray | bytes | bytearray | memoryview) -> object:
    """Decode a buffer made by `encode`; raise `PayloadDecodeError` if it is not one exactly."""
    data, readonly = _as_uint8(buf)
    try:
        return _decode(data, readonly)
    except PayloadDecodeError:  # a ValueError subclass: let it through unwrapped
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RuntimeError,
            RecursionError, struct.error) as e:  # hand-edited headers: never let these escape
        raise PayloadDecodeError(f"malformed payload: {type(e).__name__}: {e}") from e


def encode_chunk(chunk: Chunk) -> np.ndarray:
    """Encode one chunk (validated); anything that is not a chunk is a `PayloadEncodeError`."""
    if type(chunk) not in CODEC_TYPES.values():
        raise PayloadEncodeError(f"expected a chunk type, got {_type_name(chunk)}", path="chunk")
    return _encode(chunk, root="chunk")


def decode_chunk(buf: np.ndarray | bytes | bytearray | memoryview,
                 expected_type: type | None = None) -> Chunk:
    """Decode one validated chunk, optionally checking it is an `expected_type`."""
    obj = decode(buf)
    if type(obj) not in CODEC_TYPES.values():
        raise PayloadDecodeError(f"expected a chunk, got {_type_name(obj)}")
    if expected_type is not None and type(obj) is not expected_type:
        raise PayloadDecodeError(
            f"expected {expected_type.__name__}, got {type(obj).__name__}"
        )
    return obj


def _encode(obj: object, root: str) -> np.ndarray:
    """Walk `obj` into a header + blob list, then write both into one aligned buffer."""
    # 1) Build the node tree; blobs get offsets relative to the data section.
    enc = _Encoder()
    try:
        node = enc.value(obj, root)
    except RecursionError as e:
        raise PayloadEncodeError("value nested too deeply", path=root) from e
    header = {"format": FORMAT, "version": VERSION, "nbytes": enc.nbytes, "root": node}
    head = json.dumps(header, ensure_ascii=True, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")
    # 2) Allocate zeroed (deterministic padding) with a 64-byte aligned base address.
    start = _align(8 + len(head))
    total = start + enc.nbytes
    raw = np.zeros(total + ALIGN, dtype=np.uint8)
    shift = -raw.ctypes.data % ALIGN
    out = raw[shift:shift + total]
    # 3) Copy the header and each blob into place.
    out[:8] = np.frombuffer(struct.pack("<Q", len(head)), dtype=np.uint8)
    out[8:8 + len(head)] = np.frombuffer(head, dtype=np.uint8)
    for offset, blob in enc.blobs:
        out[start + offset:start + offset + blob.size] = blob
    return out


def _decode(data: np.ndarray, readonly: bool) -> object:
    """Parse and check the frame, then walk the root node."""
    if data.size < 8:
        raise PayloadDecodeError(f"truncated: {data.size} bytes, need at least 8")
    head_len = struct.unpack("<Q", data[:8].tobytes())[0]
    if 8 + head_len > data.size:
        raise PayloadDecodeError(f"truncated: header of {head_len} bytes exceeds the buffer")
    header = json.loads(data[8:8 + head_len].tobytes().decode("utf-8"))
    _expect_keys(header, {"format", "version", "nbytes", "root"}, "header")
    if header["format"] != FORMAT:
        raise PayloadDecodeError(f"not an omni_ray payload: format={header['format']!r}")
    if type(header["version"]) is not int or header["version"] != VERSION:
        raise PayloadDecodeError(f"unsupported version {header['version']!r}, expected {VERSION}")
    nbytes = _nonneg_int(header["nbytes"], "header.nbytes")
    start = _align(8 + head_len)
    if data.size != start + nbytes:
        what = "truncated" if data.size < start + nbytes else "trailing bytes"
        raise PayloadDecodeError(
            f"{what}: buffer has {data.size} bytes, header says {start + nbytes}"
        )
    dec = _Decoder(data[start:], readonly)
    obj = dec.value(header["root"], "obj")
    if dec.cursor != nbytes:
        raise PayloadDecodeError(f"data section has {nbytes - dec.cursor} unreferenced bytes")
    return obj


class _Encoder:
    """Turns a value into header nodes and collects blobs (offset, 1-D uint8 array)."""

    def __init__(self) -> None:
        self.blobs: list[tuple[int, np.ndarray]] = []
        self.nbytes = 0  # end of the last blob in the data section
        self._active: set[int] = set()  # ids of containers on the current path, to catch cycles

    def value(self, x: object, path: str) -> dict:
        """Return the node for `x`, dispatching on exact types (a subclass would lose its type)."""
        t = type(x)
        if x is None:
            return {"k": "none"}
        if t is bool:
            return {"k": "bool", "v": x}
        if t is int:
            return {"k": "int", "v": format(x, "x")}
        if t is float:
            return {"k": "float", "v": struct.pack(">d", x).hex()}
        if t is str:
            return {"k": "str", "v": x}
        if t is bytes:
            return {"k": "bytes", **self._blob(np.frombuffer(x, dtype=np.uint8))}
        if t in _ENUM_TYPES.values():
            return {"k": "enum", "t": t.__name__, "v": int(x)}
        if isinstance(x, torch.Tensor):
            return self._tensor(x, path)
        if t is np.ndarray:
            return self._ndarray(x, path)
        if t in (list, tuple, dict) or t in CODEC_TYPES.values():
            return self._container(x, path)
        raise PayloadEncodeError(f"unsupported type {_type_name(x)}", path=path)

    def _container(self, x: object, path: str) -> dict:
        """Lists, tuples, dicts and chunks: recurse, refusing cycles."""
        if id(x) in self._active:
            raise PayloadEncodeError("reference cycle", path=path)
        self._active.add(id(x))
        try:
            if type(x) in (list, tuple):
                kind = "list" if type(x) is list else "tuple"
                return {"k": kind, "v": [self.value(v, f"{path}[{i}]") for i, v in enumerate(x)]}
            if type(x) is dict:
                return {"k": "dict", "v": [self._item(k, v, path) for k, v in x.items()]}
            return self._chunk(x, path)
        finally:
            self._active.discard(id(x))

    def _item(self, key: object, v: object, path: str) -> list:
        if type(key) is not str:
            raise PayloadEncodeError(
                f"dict key {key!r} is {_type_name(key)}, expected str", path=path
            )
        return [key, self.value(v, f"{path}[{key!r}]")]

    def _chunk(self, chunk: Chunk, path: str) -> dict:
        try:
            chunk.validate()
        except PayloadError as e:
            sub = f"{path}.{e.path}" if e.path else path
            raise PayloadEncodeError(
                f"invalid {type(chunk).__name__}: {e.message}", path=sub
            ) from e
        fields = {f.name: self.value(getattr(chunk, f.name), f"{path}.{f.name}")
                  for f in dataclasses.fields(chunk)}
        return {"k": "chunk", "t": type(chunk).__name__, "f": fields}

    def _tensor(self, x: torch.Tensor, path: str) -> dict:
        """Dense tensor of any plain dtype -> CPU contiguous bytes. Autograd state is not kept."""
        name = str(x.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES or x.is_quantized or x.layout is not torch.strided:
            raise PayloadEncodeError(
                f"unsupported tensor: dtype {x.dtype}, layout {x.layout}", path=path
            )
        try:
            raw = _tensor_bytes(x)
        except (RuntimeError, NotImplementedError, TypeError) as e:
            raise PayloadEncodeError(f"cannot read tensor bytes: {e}", path=path) from e
        return {"k": "tensor", "dtype": name, "shape": list(x.shape), **self._blob(raw)}

    def _ndarray(self, x: np.ndarray, path: str) -> dict:
        if x.dtype.kind not in _NUMPY_KINDS:
            raise PayloadEncodeError(f"unsupported ndarray dtype {x.dtype}", path=path)
        flat = (x if x.flags.c_contiguous else x.copy(order="C")).reshape(-1)
        return {"k": "ndarray", "dtype": x.dtype.str, "shape": list(x.shape),
                **self._blob(flat.view(np.uint8))}

    def _blob(self, raw: np.ndarray) -> dict:
        offset = _align(self.nbytes)
        self.blobs.append((offset, raw))
        self.nbytes = offset + raw.size
        return {"off": offset, "len": int(raw.size)}


class _Decoder:
    """Turns header nodes back into values, reading blobs from the data section in order."""

    def __init__(self, data: np.ndarray, readonly: bool) -> None:
        self.data = data  # the data section, 1-D uint8
        self.readonly = readonly  # copy blobs out instead of aliasing the buffer
        self.cursor = 0  # end of the last blob read; the next one must start at _align(cursor)
        self._kinds = {
            "none": self._none, "bool": self._bool, "int": self._int, "float": self._float,
            "str": self._str, "bytes": self._bytes, "list": self._list, "tuple": self._tuple,
            "dict": self._dict, "enum": self._enum, "tensor": self._tensor,
            "ndarray": self._ndarray, "chunk": self._chunk,
        }

    def value(self, node: object, path: str) -> object:
        if type(node) is not dict or type(node.get("k")) is not str:
            raise PayloadDecodeError("node is not an object with a kind tag 'k'", path=path)
        kind = self._kinds.get(node["k"])
        if kind is None:
            raise PayloadDecodeError(f"unknown kind tag {node['k']!r}", path=path)
        return kind(node, path)

    def _none(self, node: dict, path: str) -> None:
        _expect_keys(node, {"k"}, path)

    def _bool(self, node: dict, path: str) -> bool:
        return _scalar(node, bool, path)

    def _int(self, node: dict, path: str) -> int:
        v = _scalar(node, str, path)
        if not _HEX_INT.fullmatch(v):
            raise PayloadDecodeError(f"bad hex int {v[:40]!r}", path=path)
        return int(v, 16)

    def _float(self, node: dict, path: str) -> float:
        v = _scalar(node, str, path)
        if not _FLOAT_BITS.fullmatch(v):
            raise PayloadDecodeError(f"bad float bits {v[:40]!r}", path=path)
        return struct.unpack(">d", bytes.fromhex(v))[0]

    def _str(self, node: dict, path: str) -> str:
        return _scalar(node, str, path)

    def _bytes(self, node: dict, path: str) -> bytes:
        _expect_keys(node, {"k", "off", "len"}, path)
        return self._span(node, path).tobytes()

    def _list(self, node: dict, path: str) -> list:
        items = _scalar(node, list, path)
        return [self.value(v, f"{path}[{i}]") for i, v in enumerate(items)]

    def _tuple(self, node: dict, path: str) -> tuple:
        return tuple(self._list(node, path))

    def _dict(self, node: dict, path: str) -> dict:
        out: dict = {}
        for item in _scalar(node, list, path):
            if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
                raise PayloadDecodeError("dict item is not a [str, node] pair", path=path)
            if item[0] in out:
                raise PayloadDecodeError(f"duplicate dict key {item[0]!r}", path=path)
            out[item[0]] = self.value(item[1], f"{path}[{item[0]!r}]")
        return out

    def _enum(self, node: dict, path: str) -> enum.IntEnum:
        _expect_keys(node, {"k", "t", "v"}, path)
        cls = _ENUM_TYPES.get(node["t"]) if type(node["t"]) is str else None
        if cls is None or type(node["v"]) is not int:
            raise PayloadDecodeError(f"unknown enum {node['t']!r} or bad value", path=path)
        return cls(node["v"])

    def _tensor(self, node: dict, path: str) -> torch.Tensor:
        _expect_keys(node, {"k", "dtype", "shape", "off", "len"}, path)
        dtype = _TORCH_DTYPES.get(node["dtype"]) if type(node["dtype"]) is str else None
        if dtype is None:
            raise PayloadDecodeError(f"unknown torch dtype {node['dtype']!r}", path=path)
        shape = self._shape(node, dtype.itemsize, path)
        raw = self._owned(self._span(node, path), dtype.itemsize)
        if raw.size == 0:  # from_numpy gives an empty array stride 0, which view(dtype) rejects
            return torch.empty(shape, dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(shape)

    def _ndarray(self, node: dict, path: str) -> np.ndarray:
        _expect_keys(node, {"k", "dtype", "shape", "off", "len"}, path)
        if type(node["dtype"]) is not str:
            raise PayloadDecodeError(f"bad numpy dtype {node['dtype']!r}", path=path)
        dtype = np.dtype(node["dtype"])
        if dtype.kind not in _NUMPY_KINDS:
            raise PayloadDecodeError(f"unsupported ndarray dtype {dtype}", path=path)
        shape = self._shape(node, dtype.itemsize, path)
        raw = self._owned(self._span(node, path), dtype.itemsize)
        return raw.view(dtype).reshape(shape)

    def _chunk(self, node: dict, path: str) -> Chunk:
        _expect_keys(node, {"k", "t", "f"}, path)
        cls = CODEC_TYPES.get(node["t"]) if type(node["t"]) is str else None
        if cls is None:
            raise PayloadDecodeError(f"unknown chunk type {node['t']!r}", path=path)
        names = {f.name for f in dataclasses.fields(cls)}
        _expect_keys(node["f"], names, f"{path} ({cls.__name__} fields)")
        chunk = cls(**{n: self.value(node["f"][n], f"{path}.{n}") for n in node["f"]})
        try:
            chunk.validate()
        except PayloadError as e:
            sub = f"{path}.{e.path}" if e.path else path
            raise PayloadDecodeError(f"invalid {cls.__name__}: {e.message}", path=sub) from e
        return chunk

    def _shape(self, node: dict, itemsize: int, path: str) -> tuple[int, ...]:
        """Shape as a tuple of non-negative ints whose product matches the blob length."""
        if type(node["shape"]) is not list:
            raise PayloadDecodeError(f"bad shape {node['shape']!r}", path=path)
        shape = tuple(_nonneg_int(d, f"{path}.shape") for d in node["shape"])
        numel = 1
        for d in shape:
            numel *= d
        if numel * itemsize != node["len"]:
            raise PayloadDecodeError(
                f"shape {shape} x {itemsize} bytes != blob length {node['len']!r}", path=path
            )
        return shape

    def _span(self, node: dict, path: str) -> np.ndarray:
        """The blob's bytes as a view of the buffer, checked to sit where the encoder puts it."""
        off = _nonneg_int(node["off"], f"{path}.off")
        size = _nonneg_int(node["len"], f"{path}.len")
        if off != _align(self.cursor) or off + size > self.data.size:
            raise PayloadDecodeError(
                f"blob [{off}, {off + size}) out of place: expected offset {_align(self.cursor)}"
                f" within {self.data.size} data bytes", path=path
            )
        self.cursor = off + size
        return self.data[off:off + size]

    def _owned(self, raw: np.ndarray, itemsize: int) -> np.ndarray:
        """`raw`, or a copy of it if the buffer is read-only or too misaligned for the dtype."""
        if self.readonly or raw.ctypes.data % min(itemsize, 16):
            return raw.copy()
        return raw


def _tensor_bytes(x: torch.Tensor) -> np.ndarray:
    """The elements of `x` in C order as 1-D uint8 on the CPU; copies only if `x` is a view."""
    x = x.detach().resolve_conj().resolve_neg()
    # Reinterpret as a same-size int first: bit-exact, and int dtypes have the copy kernels that
    # reshape/.cpu() need, which shell dtypes (int1..7, uint1..7, bits*) lack.
    flat = x.view(_SAME_SIZE_INT.get(x.dtype.itemsize, x.dtype)).cpu().reshape(-1)
    if flat.numel() == 0:  # may carry stride 0, which view(uint8) rejects; no bytes anyway
        return np.empty(0, np.uint8)
    if flat.stride(0) != 1:  # `.contiguous()` would keep the stride of a size-1 dim
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).numpy()


def _as_uint8(buf: object) -> tuple[np.ndarray, bool]:
    """View `buf` as a 1-D uint8 array without copying; also say whether it is read-only."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise PayloadDecodeError(f"expected a 1-D uint8 array, got {buf.dtype} {buf.shape}")
        arr = buf if buf.flags.c_contiguous else np.ascontiguousarray(buf)
        return arr, not arr.flags.writeable
    if isinstance(buf, (bytes, bytearray, memoryview)):
        view = memoryview(buf)
        if not view.c_contiguous:
            raise PayloadDecodeError("expected a contiguous buffer")
        return np.frombuffer(view.cast("B"), dtype=np.uint8), view.readonly
    raise PayloadDecodeError(
        f"expected ndarray, bytes, bytearray or memoryview, got {_type_name(buf)}"
    )


def _expect_keys(node: object, keys: set[str], path: str) -> None:
    """Exactly `keys`: a missing key is malformed, an unknown one would be silently dropped."""
    if type(node) is not dict:
        raise PayloadDecodeError(f"expected an object, got {type(node).__name__}", path=path)
    if node.keys() != keys:
        missing, unknown = sorted(keys - node.keys()), sorted(node.keys() - keys)
        raise PayloadDecodeError(f"missing keys {missing}, unknown keys {unknown}", path=path)


def _scalar(node: dict, typ: type, path: str):
    """`node["v"]` of a {"k", "v"} node, checking the value's exact type."""
    _expect_keys(node, {"k", "v"}, path)
    if type(node["v"]) is not typ:
        raise PayloadDecodeError(f"expected {typ.__name__}, got {node['v']!r:.40}", path=path)
    return node["v"]


def _nonneg_int(v: object, path: str) -> int:
    if type(v) is not int or v < 0:
        raise PayloadDecodeError(f"expected a non-negative int, got {v!r}", path=path)
    return v


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _type_name(x: object) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"
