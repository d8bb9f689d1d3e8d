"""A context's spilled state in a descriptor (the face keeps the descriptor:
spill.py). Format, the same in memory and in files: the token count (8
bytes, little-endian), the tokens (4 bytes each), then llama.cpp's
sequence state."""

import fcntl
import mmap
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


#: The seals of a state handed to another process: its bytes and size fixed.
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def memfd_of(saved: Saved, name: str, header: bytes = b"", *, sealed: bool = False) -> int:
    """A new memfd holding `header`, then `saved` (in the spill format);
    the caller's. `sealed`: with SEALS added once written."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealed else 0))
    try:
        os.pwrite(fd, header, 0)
        write_saved(fd, saved, len(header))
        if sealed:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
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


def map_saved(fd: int, start: int, max_tokens: int) -> Saved:
    """The state written by `write_saved` at `start`, its KV bytes a private
    mapping of `fd` (not a copy: pages are read when used); ValueError when
    it is damaged or holds `max_tokens` tokens or more."""
    size = os.fstat(fd).st_size
    if size - start < 8:
        raise ValueError("spilled state: truncated")
    view = memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE))[start:]
    count = int.from_bytes(view[:8], "little")
    if count >= max_tokens:
        raise ValueError(f"a state of {count} tokens, the context holds {max_tokens}")
    if 8 + 4 * count > len(view):
        raise ValueError("spilled state: truncated token list")
    tokens = array("i")
    tokens.frombytes(view[8:8 + 4 * count])
    return Saved(tokens=_little(tokens).tolist(), data=view[8 + 4 * count:])


def _little(tokens: "array[int]") -> "array[int]":
    """`tokens` in little-endian order (swapped in place on a big-endian host)."""
    if tokens.itemsize != 4:
        raise RuntimeError("C int is not 4 bytes here")
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens
