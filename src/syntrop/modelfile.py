"""What a model file says about itself: format, architecture, quantization,
license, and the scalar metadata (layers, heads, context) the memory a
model needs is computed from. Shared by modeld (what it stores) and runtimed
(what it leases before it loads). A pure reader of the file's header, with
limits, for GGUF and safetensors, and ONNX by its first bytes (a voice:
runtimed's Speak; its header holds nothing the store uses).

Why not gguf.GGUFReader: it materialises every array of the header (the
tokenizer's 49,152 tokens and merges) as numpy objects and maps every
tensor; on SmolLM2-135M it takes 8.4 s, and `import gguf` 0.75 s (numpy).
This reader streams the header, skips arrays by their lengths, keeps only
scalars and short strings, and reads SmolLM2's header in ~50 ms. The gguf
package is its oracle in the tests (same values on files it writes), and the
name tables below are checked against its enums there.
"""

import io
import json
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import BinaryIO

GGUF_MAGIC = b"GGUF"
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_STRING = 16 << 20
MAX_ARRAY = 1 << 26
MAX_DIMS = 8
#: Strings longer than this are skipped, not kept (chat templates).
KEEP_STRING = 4096
MAX_SAFETENSORS_HEADER = 100 << 20

#: llama.cpp's LLAMA_FTYPE (gguf.LlamaFileType) without its MOSTLY_/ALL_ prefix.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}

#: ggml's tensor types (gguf.GGMLQuantizationType).
TENSOR_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}

# GGUF value types: code -> struct format of a scalar.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

Scalar = str | int | float | bool


class InvalidModel(ValueError):
    """Not a model file this store accepts, or a damaged header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    format: str
    architecture: str | None = None
    quantization: str | None = None
    license: str | None = None
    #: Scalar and short string metadata, by key.
    metadata: dict[str, Scalar] = field(default_factory=dict)


def read_fd(fd: int) -> ModelInfo:
    """Read the header of the file open at `fd` (from offset 0; the file
    position of `fd` is not used)."""
    return read(_PositionalReader(fd))


def read(stream: "BinaryIO | io.RawIOBase") -> ModelInfo:
    head = stream.read(8)
    if head[:4] == GGUF_MAGIC:
        if len(head) < 8:
            raise InvalidModel("the header is truncated")
        return _gguf(stream, head)
    if _onnx(head):
        return ModelInfo(format="onnx")
    if len(head) == 8:
        return _safetensors(stream, struct.unpack("<Q", head)[0])
    raise InvalidModel("not a GGUF or safetensors file")


#: Protocol buffer tags that follow ModelProto's ir_version (field 1): its
#: producer_name, producer_version, domain, model_version, doc_string,
#: graph and opset_import.
_ONNX_NEXT = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42})


def _onnx(head: bytes) -> bool:
    """Whether `head` begins an ONNX ModelProto: ir_version first (tag 8, a
    one-byte version of 3 to 15), then one of the fields that follow it.
    (A safetensors header that began so would be over a megabyte long
    with these very low bytes; none is.)"""
    return len(head) == 8 and head[0] == 0x08 and 3 <= head[1] <= 15 and head[2] in _ONNX_NEXT


class _PositionalReader(io.RawIOBase):
    """A raw reader over pread(2), so the header can be read from a shared
    descriptor without moving its position."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "memoryview | bytearray") -> int:  # type: ignore[override]
        count = os.preadv(self.fd, [buffer], self.offset)
        self.offset += count
        return count


class _Reader:
    """Bounded reads from a buffer refilled from the stream; skipping the
    strings of a tokenizer array is a loop over lengths in that buffer."""

    def __init__(self, stream: "BinaryIO | io.RawIOBase") -> None:
        self.stream = stream
        self.buffer = b""
        self.pos = 0

    def _fill(self, count: int) -> None:
        """Make at least `count` bytes available at self.pos."""
        if len(self.buffer) - self.pos >= count:
            return
        rest = self.buffer[self.pos:]
        more = self.stream.read(max(count - len(rest), 1 << 20))
        self.buffer = rest + more
        self.pos = 0
        if len(self.buffer) < count:
            raise InvalidModel("the header is truncated")

    def exact(self, count: int) -> bytes:
        self._fill(count)
        data = self.buffer[self.pos:self.pos + count]
        self.pos += count
        return data

    def unpack(self, fmt: str) -> object:
        size = struct.calcsize(fmt)
        self._fill(size)
        value = struct.unpack_from(fmt, self.buffer, self.pos)[0]
        self.pos += size
        return value

    def u32(self) -> int:
        value = self.unpack("<I")
        assert isinstance(value, int)
        return value

    def u64(self) -> int:
        value = self.unpack("<Q")
        assert isinstance(value, int)
        return value

    def string(self, *, keep: int = MAX_STRING) -> str | None:
        length = self.u64()
        if length > MAX_STRING:
            raise InvalidModel("a header string is too long")
        if length > keep:
            self.skip(length)
            return None
        try:
            return self.exact(length).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidModel("a header string is not UTF-8") from None

    def skip(self, count: int) -> None:
        while count > 0:
            available = len(self.buffer) - self.pos
            if available >= count:
                self.pos += count
                return
            count -= available
            self.pos = len(self.buffer)
            self._fill(min(count, 1 << 20))

    def skip_strings(self, count: int) -> None:
        unpack_from = struct.unpack_from
        buffer, pos, end = self.buffer, self.pos, len(self.buffer)
        while count:
            if end - pos < 8:
                self.pos = pos
                self._fill(8)
                buffer, pos, end = self.buffer, self.pos, len(self.buffer)
            length = unpack_from("<Q", buffer, pos)[0]
            if length > MAX_STRING:
                raise InvalidModel("a header string is too long")
            pos += 8 + length
            count -= 1
            if pos > end:
                self.pos = end
                self.skip(pos - end)
                buffer, pos, end = self.buffer, self.pos, len(self.buffer)
        self.pos = pos


def _value(reader: _Reader, kind: int, depth: int = 0) -> Scalar | None:
    """One value; arrays are skipped (None), long strings too."""
    if kind in _SCALARS:
        value = reader.unpack(_SCALARS[kind])
        assert isinstance(value, str | int | float | bool)
        return value
    if kind == _STRING:
        return reader.string(keep=KEEP_STRING)
    if kind == _ARRAY and depth == 0:
        item = reader.u32()
        count = reader.u64()
        if count > MAX_ARRAY:
            raise InvalidModel("a header array is too long")
        if item in _SCALARS:
            reader.skip(count * struct.calcsize(_SCALARS[item]))
        elif item == _STRING:
            reader.skip_strings(count)
        else:
            for _ in range(count):
                _value(reader, item, depth + 1)
        return None
    raise InvalidModel(f"unknown GGUF value type {kind}")


def _gguf(stream: "BinaryIO | io.RawIOBase", head: bytes) -> ModelInfo:
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise InvalidModel(f"GGUF version {version} is not supported (2 and 3 are)")
    reader = _Reader(stream)
    tensors = reader.u64()
    kv_count = reader.u64()
    if kv_count > MAX_KV or tensors > MAX_TENSORS:
        raise InvalidModel("the GGUF header declares too many entries")
    metadata: dict[str, Scalar] = {}
    for _ in range(kv_count):
        key = reader.string(keep=1024)
        kind = reader.u32()
        value = _value(reader, kind)
        if key is not None and value is not None:
            metadata[key] = value
    architecture = metadata.get("general.architecture")
    license_ = metadata.get("general.license")
    file_type = metadata.get("general.file_type")
    quantization = None
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        quantization = FILE_TYPES.get(file_type, f"ftype-{file_type}")
    else:
        quantization = _dominant_tensor_type(reader, tensors)
    return ModelInfo(
        format="gguf",
        architecture=architecture if isinstance(architecture, str) else None,
        quantization=quantization,
        license=license_ if isinstance(license_, str) else None,
        metadata=metadata,
    )


def _dominant_tensor_type(reader: _Reader, tensors: int) -> str | None:
    """The tensor type holding the most elements (files without
    general.file_type)."""
    elements: Counter[int] = Counter()
    for _ in range(tensors):
        reader.string(keep=0)
        dims = reader.u32()
        if dims > MAX_DIMS:
            raise InvalidModel("a tensor has too many dimensions")
        count = 1
        for _ in range(dims):
            count *= reader.u64()
        kind = reader.u32()
        reader.u64()  # offset
        elements[kind] += count
    if not elements:
        return None
    kind, _ = elements.most_common(1)[0]
    return TENSOR_TYPES.get(kind, f"type-{kind}")


def _safetensors(stream: "BinaryIO | io.RawIOBase", length: int) -> ModelInfo:
    if not 2 <= length <= MAX_SAFETENSORS_HEADER:
        raise InvalidModel("not a GGUF or safetensors file")
    raw = _Reader(stream).exact(length)
    if raw[:1] != b"{":
        raise InvalidModel("not a GGUF or safetensors file")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidModel("the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise InvalidModel("the safetensors header is not an object")
    elements: Counter[str] = Counter()
    for name, tensor in header.items():
        if name == "__metadata__" or not isinstance(tensor, dict):
            continue
        shape = tensor.get("shape")
        dtype = tensor.get("dtype")
        if isinstance(dtype, str) and isinstance(shape, list):
            count = 1
            for dim in shape:
                count *= dim if isinstance(dim, int) else 0
            elements[dtype.upper()] += count
    found = header.get("__metadata__")
    metadata: dict[str, Scalar] = {}
    if isinstance(found, dict):
        metadata = {k: v for k, v in found.items() if isinstance(v, str) and len(v) <= KEEP_STRING}
    return ModelInfo(
        format="safetensors",
        quantization=elements.most_common(1)[0][0] if elements else None,
        metadata=metadata,
    )
