"""Models from modeld, runtimed's side: the descriptor modeld hands over and
the check of its bytes against modeld's digest, before any engine sees it.

The descriptor carries modeld's shared lock ("in use"); runtimed passes it
on to the model's engine worker (residency.py), which keeps it open while
the model is resident.
"""

import os
from pathlib import Path

#: Bytes hashed per read.
CHUNK = 1 << 20


class WeightsDiffer(Exception):
    """The bytes behind the descriptor do not hash to the pinned digest."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


def bare(digest: str) -> str:
    return digest.removeprefix("sha256:").lower()


def sha256_of(fd: int) -> str:
    """SHA-256 (hex) of the whole file behind `fd`, read with pread so the
    descriptor's offset is left alone."""
    import hashlib  # here: libcrypto is mapped by the processes that hash weights

    digest = hashlib.sha256()
    offset = 0
    while True:
        data = os.pread(fd, CHUNK, offset)
        if not data:
            return digest.hexdigest()
        digest.update(data)
        offset += len(data)


def verified(fd: int, digest: str) -> None:
    """Raise WeightsDiffer unless the bytes behind `fd` hash to `digest`
    (blocking: reads the whole file)."""
    actual = sha256_of(fd)
    if actual != bare(digest):
        raise WeightsDiffer(bare(digest), actual)


async def open_in_modeld(socket: Path, name: str, timeout: float) -> tuple[int, str, int]:
    """A model's descriptor from modeld (Model1.OpenModel over `socket`),
    duplicated for the caller to keep and close, with the digest (bare hex)
    and size modeld reports. Raises modeld's ModelNotFound or
    InvalidIdentifier, or OSError when modeld cannot be reached."""
    from syntrop.interfaces.model import Model1
    from syntrop.varlink.client import connect

    async with await connect(Model1, address=socket, timeout=timeout) as modeld:
        with await modeld.OpenModel(name=name) as reply:
            return os.dup(reply["fd"].fileno()), bare(str(reply["digest"])), int(reply["size"])
