"""A context's spilled state in a descriptor (the face keeps the descriptor:
spill.py). Format, the same in memory and in files: the token count (8
bytes, little-endian), the tokens (4 bytes each), then llama.cpp's
sequence state."""

import os
import sys
from array import array

from syntrop.runtimed.worker.engine import Saved


def write_saved(fd: int, saved: Saved, start: int = 0) -> None:
    """Write `saved` at `start` in `fd` (in the spill format)."""
    tokens = _little(array("i", saved.tokens))
    view = memoryview(len(saved.tokens).to_bytes(8, "little") + tokens.tobytes() + saved.data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], start + offset)


def memfd_of(saved: Saved, name: str, header: bytes = b"") -> int:
    """A new memfd holding `header`, then `saved` (in the spill format);
    the caller's."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.pwrite(fd, header, 0)
        write_saved(fd, saved, len(header))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_saved(fd: int, start: int = 0) -> Saved:
    """The state written by `write_saved` at `start` (ValueError when it is
    damaged)."""
    size = os.fstat(fd).st_size - start
    blob = os.pread(fd, size, start) if size > 0 else b""
    if len(blob) < 8:
        raise ValueError("spilled state: truncated")
    count = int.from_bytes(blob[:8], "little")
    if 8 + 4 * count > len(blob):
        raise ValueError("spilled state: truncated token list")
    tokens = array("i")
    tokens.frombytes(blob[8:8 + 4 * count])
    return Saved(tokens=_little(tokens).tolist(), data=blob[8 + 4 * count:])


def _little(tokens: "array[int]") -> "array[int]":
    """`tokens` in little-endian order (swapped in place on a big-endian host)."""
    if tokens.itemsize != 4:
        raise RuntimeError("C int is not 4 bytes here")
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens
