"""syntrop.system.files: anonymous files, reflink or copy, locks that travel
with descriptors."""

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from syntrop.system import files
from tests.unit.modeld import xfs


def test_anonymous_file_is_invisible_until_linked(tmp_path: Path) -> None:
    fd = files.open_anonymous(tmp_path)
    assert fd is not None
    try:
        os.write(fd, b"verified")
        assert os.listdir(tmp_path) == []
        files.link_anonymous(fd, tmp_path / "blob")
        assert (tmp_path / "blob").read_bytes() == b"verified"
        assert (tmp_path / "blob").stat().st_mode & 0o777 == 0o444
        with pytest.raises(FileExistsError):
            files.link_anonymous(fd, tmp_path / "blob")
    finally:
        os.close(fd)


def _copy(tmp: Path, source: Path) -> tuple[str, Path]:
    target = tmp / "target"
    src = os.open(source, os.O_RDONLY)
    dst = os.open(target, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        method = files.clone_or_copy(src, dst, source.stat().st_size)
    finally:
        os.close(src)
        os.close(dst)
    return method, target


def test_copy_falls_back_to_copy_file_range_on_ext4_or_tmpfs(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_bytes(os.urandom(3 << 20))
    method, target = _copy(tmp_path, source)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                        text=True).stdout.strip()
    if fs in ("xfs", "btrfs"):
        pytest.skip(f"{tmp_path} is on {fs}, which reflinks")
    assert method == "copy_file_range"
    assert target.read_bytes() == source.read_bytes()


def test_reflink_on_xfs(tmp_path: Path) -> None:
    with xfs.mounted(tmp_path) as mount:
        source = mount / "source"
        source.write_bytes(os.urandom(4 << 20))
        os.sync()
        before = files.free_bytes(mount)
        method, target = _copy(mount, source)
        assert method == "reflink"
        assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(
            source.read_bytes()).digest()
        os.sync()
        assert xfs.shared_extents(target)
        assert before - files.free_bytes(mount) < 1 << 20  # no second copy of 4 MiB


def test_lock_travels_with_a_passed_descriptor(tmp_path: Path) -> None:
    """The in-use mark of OpenModel: a shared flock stays while another
    process holds the passed descriptor, and goes when it closes it."""
    path = tmp_path / "blob"
    path.write_bytes(b"x")
    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys; s = socket.socket(fileno=int(sys.argv[1])); "
         "_, fds, _, _ = socket.recv_fds(s, 1, 1); s.send(b'k'); s.recv(1)",
         str(theirs.fileno())],
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
    )
    theirs.close()
    try:
        fd = os.open(path, os.O_RDONLY)
        files.lock_shared(fd)
        socket.send_fds(ours, [b"f"], [fd])
        os.close(fd)
        assert ours.recv(1) == b"k"
        assert files.held_elsewhere(path)
        ours.send(b"q")  # the child exits, closing its copy
        child.wait(5)
        assert not files.held_elsewhere(path)
    finally:
        ours.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_stored_blob_is_0444_under_the_unit_s_umask(tmp_path: Path) -> None:
    """modeld runs with UMask=0077; runtimed opens the descriptor it is
    handed through /proc/self/fd/N, which checks the mode against its own
    user. A blob that came out 0400 could not be loaded by runtimed."""
    from syntrop.modeld.blobs import BlobTree

    blobs = BlobTree(tmp_path)
    old = os.umask(0o077)
    try:
        fd = files.open_anonymous(blobs.blobs)
    finally:
        os.umask(old)
    assert fd is not None
    try:
        os.write(fd, b"weights")
        assert blobs.link_anonymous(fd, "0" * 64)
    finally:
        os.close(fd)
    assert blobs.path("0" * 64).stat().st_mode & 0o777 == 0o444


def test_linking_a_name_to_the_blob_it_already_names_leaves_no_temporary(
        tmp_path: Path) -> None:
    """A re-pull of an existing name relinks it: rename(2) onto the same
    inode does nothing, and used to leave `.tag.XXXX.tmp` behind each time."""
    from syntrop.modeld.blobs import BlobTree

    blobs = BlobTree(tmp_path)
    for digest, content in (("1" * 64, b"one"), ("2" * 64, b"two")):
        fd = files.open_anonymous(blobs.blobs)
        assert fd is not None
        try:
            os.write(fd, content)
            assert blobs.link_anonymous(fd, digest)
        finally:
            os.close(fd)
    for digest in ("1" * 64, "1" * 64, "2" * 64, "2" * 64, "1" * 64):
        blobs.link_name("m", "latest", "gguf", digest)
    assert sorted(p.name for p in (blobs.by_name / "m").iterdir()) == ["latest.gguf"]
    assert blobs.name_path("m", "latest", "gguf").read_bytes() == b"one"
