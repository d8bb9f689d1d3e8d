"""A tiny GGUF writer for hostile files: every length and count is written
as given, so a test can declare what the bytes do not hold."""

import struct
from dataclasses import dataclass, field

MAGIC = b"GGUF"
UINT32, STRING, ARRAY, UINT64 = 4, 8, 9, 10
F32 = 0


def string(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]
    kind: int = F32
    offset: int = 0


@dataclass
class Gguf:
    """A header (key/values, tensor infos) and the data after it. `kv` holds
    already encoded values: (key, type code, value bytes)."""

    kv: list[tuple[str, int, bytes]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    data: bytes = b""
    #: Counts to declare instead of the true ones.
    kv_count: int | None = None
    tensor_count: int | None = None

    def add_string(self, key: str, value: str) -> "Gguf":
        self.kv.append((key, STRING, string(value)))
        return self

    def add_u32(self, key: str, value: int) -> "Gguf":
        self.kv.append((key, UINT32, struct.pack("<I", value)))
        return self

    def add_raw(self, key: str, kind: int, value: bytes) -> "Gguf":
        self.kv.append((key, kind, value))
        return self

    def bytes(self) -> bytes:
        out = [MAGIC, struct.pack("<I", 3),
               struct.pack("<Q", len(self.tensors) if self.tensor_count is None
                           else self.tensor_count),
               struct.pack("<Q", len(self.kv) if self.kv_count is None else self.kv_count)]
        for key, kind, value in self.kv:
            out += [string(key), struct.pack("<I", kind), value]
        for tensor in self.tensors:
            out += [string(tensor.name), struct.pack("<I", len(tensor.dims))]
            out += [struct.pack("<Q", d) for d in tensor.dims]
            out += [struct.pack("<I", tensor.kind), struct.pack("<Q", tensor.offset)]
        header = b"".join(out)
        header += b"\0" * (-len(header) % 32)  # general.alignment's default
        return header + self.data


def base() -> Gguf:
    """A well-formed llama-shaped header with one 16-float tensor."""
    return (Gguf(tensors=[Tensor("token_embd.weight", (16,))], data=b"\0" * 64)
            .add_string("general.architecture", "llama")
            .add_u32("llama.block_count", 1)
            .add_u32("llama.context_length", 64))


def array(item: int, count: int, items: bytes = b"") -> bytes:
    return struct.pack("<IQ", item, count) + items
