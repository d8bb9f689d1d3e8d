"""A loop-mounted XFS image, to test reflink (FICLONE) for real."""

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_SHARED = 0x2000


def unavailable() -> str | None:
    """Why an XFS image cannot be mounted here, or None."""
    if os.geteuid() != 0:
        return "mounting a loop XFS image needs root"
    if shutil.which("mkfs.xfs") is None:
        return "mkfs.xfs is missing (Debian package xfsprogs)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices"
    return None


@contextlib.contextmanager
def mounted(directory: Path) -> Iterator[Path]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    image = directory / "xfs.img"
    mountpoint = directory / "xfs"
    mountpoint.mkdir()
    with image.open("wb") as file:
        file.truncate(320 << 20)  # sparse; mkfs.xfs wants at least 300 MiB
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    result = subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot loop-mount an XFS image: {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)
        image.unlink()


def shared_extents(path: Path) -> bool:
    """Whether any extent of `path` is shared with another file (FIEMAP)."""
    count = 32
    request = struct.pack("=QQLLLL", 0, 0xFFFFFFFFFFFFFFFF, 0, 0, count, 0)
    buffer = bytearray(request + bytes(56 * count))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buffer)
    finally:
        os.close(fd)
    mapped = struct.unpack_from("=L", buffer, 20)[0]
    for index in range(mapped):
        flags = struct.unpack_from("=L", buffer, 32 + 56 * index + 40)[0]
        if flags & FIEMAP_EXTENT_SHARED:
            return True
    return False
