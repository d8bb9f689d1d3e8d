"""Imports and pull receivers: verified before visible, partials that resume."""

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop.modeld import staging
from syntrop.modeld.blobs import BlobTree
from syntrop.system import files


@pytest.fixture
def tree(tmp_path: Path) -> BlobTree:
    return BlobTree(tmp_path / "store")


def visible(tree: BlobTree) -> list[str]:
    return sorted(str(p.relative_to(tree.root)) for p in tree.root.rglob("*") if p.is_file())


def test_import_hashes_the_copy_and_links_only_when_asked(tree: BlobTree, tmp_path: Path) -> None:
    data = os.urandom(2 << 20)
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    fd = os.open(source, os.O_RDONLY)
    staged = staging.import_file(fd, tree)
    os.close(fd)
    try:
        assert staged.digest == hashlib.sha256(data).hexdigest()
        assert staged.size == len(data)
        assert staged.path is None  # O_TMPFILE: nothing to see yet
        assert visible(tree) == []
        assert staged.link(tree) is True
        assert (tree.path(staged.digest)).read_bytes() == data
    finally:
        staged.close()
    again = os.open(source, os.O_RDONLY)
    second = staging.import_file(again, tree)
    os.close(again)
    try:
        assert second.link(tree) is False  # stored once
    finally:
        second.close()
    assert visible(tree) == [f"blobs/sha256/{staged.digest}"]


def test_import_closed_unlinked_leaves_nothing(tree: BlobTree, tmp_path: Path) -> None:
    source = tmp_path / "x"
    source.write_bytes(b"abc")
    fd = os.open(source, os.O_RDONLY)
    staging.import_file(fd, tree).close()
    os.close(fd)
    assert visible(tree) == []


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe2(os.O_CLOEXEC)
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):
            os.close(fd)


def feed(write: int, data: bytes, *, close: bool = True) -> threading.Thread:
    def run() -> None:
        files.write_all(write, data)
        if close:
            os.close(write)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def pump_all(receiver: staging.Receiver) -> None:
    while not receiver.pump(time.monotonic() + 0.2):
        pass


def test_receiver_resumes_from_the_journaled_point(tree: BlobTree) -> None:
    data = os.urandom(3 << 20)
    digest = hashlib.sha256(data).hexdigest()
    path = tree.partial(digest)
    first = staging.Receiver(path, digest=digest, size=len(data), durable=0, restart=False)
    read, write = os.pipe2(os.O_CLOEXEC)
    first.prepare(read)
    os.close(read)
    feeder = feed(write, data[: 1 << 20])
    pump_all(first)
    feeder.join()
    with pytest.raises(staging.Incomplete) as caught:
        first.finish()
    assert caught.value.received == 1 << 20
    durable = first.checkpoint()
    first.close()
    assert durable == 1 << 20 and path.stat().st_size == 1 << 20

    # Bytes past the journaled point are dropped (they may be garbage).
    with path.open("ab") as file:
        file.write(b"garbage")
    second = staging.Receiver(path, digest=digest, size=len(data), durable=durable,
                              restart=False)
    assert second.offset == 1 << 20
    read, write = os.pipe2(os.O_CLOEXEC)
    second.prepare(read)
    os.close(read)
    feed(write, data[second.offset:])
    pump_all(second)
    second.finish()
    assert tree.adopt(path, digest)
    second.close()
    assert tree.path(digest).read_bytes() == data
    assert not path.exists()


def test_receiver_rejects_a_mismatch_and_oversize(tree: BlobTree) -> None:
    data = b"x" * 5000
    wrong = "0" * 64
    receiver = staging.Receiver(tree.partial(wrong), digest=wrong, size=len(data), durable=0,
                                restart=False)
    read, write = os.pipe2(os.O_CLOEXEC)
    receiver.prepare(read)
    os.close(read)
    feed(write, data)
    pump_all(receiver)
    with pytest.raises(staging.Mismatch):
        receiver.finish()
    receiver.close(discard=True)
    assert not tree.partial(wrong).exists()

    small = staging.Receiver(tree.partial(wrong), digest=wrong, size=10, durable=0,
                             restart=False)
    read, write = os.pipe2(os.O_CLOEXEC)
    small.prepare(read)
    os.close(read)
    feed(write, data)
    with pytest.raises(staging.Oversized):
        pump_all(small)
    small.close(discard=True)


def test_receiver_restart_and_exclusive(tree: BlobTree) -> None:
    digest = "1" * 64
    path = tree.partial(digest)
    path.write_bytes(b"old bytes")
    receiver = staging.Receiver(path, digest=digest, size=100, durable=9, restart=True)
    assert receiver.offset == 0 and path.stat().st_size == 0
    with pytest.raises(staging.Busy):
        staging.Receiver(path, digest=digest, size=100, durable=0, restart=False)
    receiver.close()
    staging.Receiver(path, digest=digest, size=100, durable=0, restart=False).close()


def test_receiver_checkpoints_when_the_stream_idles(tree: BlobTree) -> None:
    data = os.urandom(100_000)
    digest = hashlib.sha256(data).hexdigest()
    receiver = staging.Receiver(tree.partial(digest), digest=digest, size=len(data) * 2,
                                durable=0, restart=False)
    read, write = os.pipe2(os.O_CLOEXEC)
    receiver.prepare(read)
    os.close(read)
    feeder = feed(write, data, close=False)
    deadline = time.monotonic() + 10
    while receiver.durable < len(data) and time.monotonic() < deadline:
        assert receiver.pump(time.monotonic() + 0.5) is False
    feeder.join()
    assert receiver.durable == len(data)  # synced while idle, before the stream ends
    os.close(write)
    receiver.close()


def test_without_o_tmpfile_a_named_staging_file_is_renamed_after_verification(
    tree: BlobTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "open_anonymous", lambda directory: None)
    data = os.urandom(100_000)
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    fd = os.open(source, os.O_RDONLY)
    staged = staging.import_file(fd, tree)
    os.close(fd)
    try:
        assert staged.path is not None and staged.path.parent == tree.partials
        assert not tree.exists(staged.digest)  # staged, not at a final path
        assert staged.link(tree) is True
    finally:
        staged.close()
    assert visible(tree) == [f"blobs/sha256/{hashlib.sha256(data).hexdigest()}"]
    fd = os.open(source, os.O_RDONLY)
    staging.import_file(fd, tree).close()  # abandoned: its staging file goes
    os.close(fd)
    assert list(tree.partials.iterdir()) == []
