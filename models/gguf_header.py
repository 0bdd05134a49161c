"""The header of a GGUF file (llama.cpp's format, v2/v3, little-endian): its key/value metadata as Python
values and its tensor index, each tensor's data a numpy view of one memory map of the file.

gguf's own GGUFReader builds a numpy view per metadata item: for a 49k-token vocabulary with its merges
that is ~100k items and ~3.5 s of a 135M model's load on a 2-core CPU, more than dequantizing its weights.
This reads the same layout with `struct` in one pass (~0.1 s; string arrays in one tight loop). Block
types, their sizes and dequantizers still come from the `gguf` package, and files this does not read
(byte-swapped, future versions) go through GGUFReader (models.gguf_loader.open_reader).

Layout: magic "GGUF", version u32, tensor count u64, key/value count u64; per key/value: key (u64 length
+ UTF-8), value type u32, value (arrays: element type u32, count u64, elements); per tensor: name,
number of dims u32, dims u64 each (the contiguous one first), block type u32, data offset u64 from the
data section, which starts at the next multiple of `general.alignment` (32 by default).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = 0x46554747  # b"GGUF" read as little-endian u32
VERSIONS = (2, 3)
# value type -> struct format of one scalar (8: string, 9: array are read by hand)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# scalar types whose arrays come back as numpy arrays read in one go
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
# block types stored as plain arrays, and their numpy dtypes (the others are bytes, shaped by gguf)
PLAIN = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}


_U64 = struct.Struct("<Q")


class Unsupported(Exception):
    """A file this reader does not handle (byte-swapped, another version): GGUFReader may."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: gguf.GGMLQuantizationType  # noqa: F821
    shape: tuple[int, ...]  # GGUF order: the contiguous dimension first
    data: np.ndarray  # a view of the memory map, shaped as GGUFReader shapes it


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self) -> str:
        n = self.unpack("<Q")
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.pos : end]).decode("utf-8")
        self.pos = end
        return s

    def strings(self, count: int) -> list[str]:
        """An array of `count` strings (a vocabulary, its merges): string() in one tight loop, ~5x faster."""
        buf, pos, size, out = self.buf, self.pos, len(self.buf), []
        length = _U64.unpack_from
        for _ in range(count):
            (n,) = length(buf, pos)
            pos += 8
            if pos + n > size:
                raise ValueError(f"a string of {n} bytes runs past the end of the file")
            out.append(str(buf[pos : pos + n], "utf-8"))
            pos += n
        self.pos = pos
        return out

    def dims(self) -> tuple[int, ...]:
        n = self.unpack("<I")
        if n > 8:
            raise ValueError(f"a tensor with {n} dimensions")
        return tuple(self.unpack(f"<{n}Q")) if n > 1 else (self.unpack("<Q"),) if n else ()

    def value(self, vtype: int):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in NUMPY:
                a = np.frombuffer(self.buf, NUMPY[etype], count, self.pos)
                self.pos += a.nbytes
                return a.tolist()
            if etype == 8:
                return self.strings(count)
            return [self.value(etype) for _ in range(count)]
        if vtype not in SCALARS:
            raise ValueError(f"unknown metadata value type {vtype}")
        return self.unpack(SCALARS[vtype])


def read(path: str | Path) -> GGUFHeader:
    """-> the file's metadata and tensor index. Raises Unsupported for files GGUFReader should read, and
    ValueError / struct.error / UnicodeDecodeError for a file that is not a well-formed GGUF."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    data = np.memmap(path, mode="r").view(np.ndarray)  # (a plain view: no memmap hooks on every slice)
    cur = _Cursor(memoryview(data))
    if cur.unpack("<I") != MAGIC:
        raise ValueError("GGUF magic invalid")
    version = cur.unpack("<I")
    if version not in VERSIONS:
        raise Unsupported(f"version {version}")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("<I"))
    index = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = cur.dims()
        index.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or isinstance(align, bool) or align < 1:
        raise ValueError(f"general.alignment is {align!r}, not a positive integer")
    start = -(-cur.pos // align) * align
    tensors, seen = [], set()
    for name, dims, raw_type, offset in index:
        if name in seen:
            raise ValueError(f"tensor {name!r} appears twice")
        seen.add(name)
        qtype = gguf.GGMLQuantizationType(raw_type)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n = int(np.prod(dims, dtype=np.int64))
        np_dims = tuple(reversed(dims))
        if qtype.name in PLAIN:
            arr = np.frombuffer(data, PLAIN[qtype.name], n, start + offset).reshape(np_dims)
        else:
            arr = np.frombuffer(data, np.uint8, n * type_size // block, start + offset)
            arr = arr.reshape(quant_shape_to_byte_shape(np_dims, qtype))
        tensors.append(GGUFTensor(name, qtype, dims, arr))
    return GGUFHeader(version, metadata, tensors)
