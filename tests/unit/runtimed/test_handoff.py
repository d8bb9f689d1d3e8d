"""A state handed in with a chat (worker/handoff.py's `handed`): taken only
from a sealed memfd no larger than the context can hold, mapped rather than
copied; anything else is left unused (None), never an error."""

import contextlib
import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop.runtimed.worker import handoff
from syntrop.runtimed.worker.engine import Saved
from syntrop.runtimed.worker.saved import SEALS, memfd_of

DIGEST = "ab" * 32
#: SmolLM2-135M's shape, as its GGUF metadata says it.
METADATA = {"general.architecture": "llama", "llama.block_count": "30",
            "llama.embedding_length": "576", "llama.attention.head_count": "9",
            "llama.attention.head_count_kv": "3"}
N_CTX = 4096
DIGEST_BYTES = handoff.DIGEST
STATE = Saved(tokens=[1, 2, 3, 4], data=b"kv" * 512)


def handed(fd: int) -> Saved | None:
    return handoff.handed([fd], DIGEST, N_CTX, lambda: METADATA)


def header() -> bytes:
    return DIGEST.encode()


@pytest.fixture
def sealed() -> Iterator[int]:
    fd = memfd_of(STATE, "test-state", header(), sealed=True)
    yield os.dup(fd)
    os.close(fd)


def test_a_sealed_memfd_is_taken_mapped(sealed: int) -> None:
    saved = handed(sealed)
    assert saved is not None and saved.tokens == STATE.tokens
    assert isinstance(saved.data, memoryview) and bytes(saved.data) == STATE.data


def test_the_producer_seals_what_it_hands_out(sealed: int) -> None:
    try:
        assert fcntl.fcntl(sealed, fcntl.F_GET_SEALS) & SEALS == SEALS
        with pytest.raises(PermissionError):
            os.pwrite(sealed, b"x", 0)
    finally:
        os.close(sealed)


def test_an_unsealed_memfd_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    fd = memfd_of(STATE, "test-state", header())
    assert handed(fd) is None
    assert "not sealed" in caplog.text


def test_a_memfd_sealed_against_growth_only_is_refused() -> None:
    fd = os.memfd_create("test-state", os.MFD_ALLOW_SEALING)
    os.write(fd, header() + len(STATE.tokens).to_bytes(8, "little") + b"\0" * 16 + STATE.data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
    assert handed(fd) is None


def test_a_regular_file_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = memfd_of(STATE, "test-state", header(), sealed=True)
    try:
        (tmp_path / "state").write_bytes(os.pread(source, 1 << 20, 0))
    finally:
        os.close(source)
    assert handed(os.open(tmp_path / "state", os.O_RDONLY)) is None
    assert "not a memfd" in caplog.text


def piped(data: bytes) -> int:
    """The read end of a pipe `data` is written into (by a thread, as
    routerd copies a member's state in as it comes), then closed."""
    read, write = os.pipe()

    def send() -> None:
        with os.fdopen(write, "wb") as out, contextlib.suppress(BrokenPipeError):
            out.write(data)

    threading.Thread(target=send, daemon=True).start()
    return read


def state_bytes() -> bytes:
    fd = memfd_of(STATE, "test-state", header(), sealed=True)
    try:
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


def test_a_pipe_is_read_to_its_end_into_a_sealed_memfd_of_the_workers() -> None:
    saved = handed(piped(state_bytes()))
    assert saved is not None
    assert saved.tokens == STATE.tokens and bytes(saved.data) == STATE.data
    taken = handoff.take(piped(b"x" * (3 << 20)), 4 << 20)
    try:
        assert os.fstat(taken).st_size == 3 << 20
        assert fcntl.fcntl(taken, fcntl.F_GET_SEALS) & SEALS == SEALS
    finally:
        os.close(taken)


def test_a_socket_is_read_like_a_pipe() -> None:
    ours, theirs = socket.socketpair()
    def send() -> None:
        ours.sendall(state_bytes())
        ours.shutdown(socket.SHUT_WR)

    with ours:
        threading.Thread(target=send, daemon=True).start()
        saved = handed(theirs.detach())
    assert saved is not None and saved.tokens == STATE.tokens


def test_a_pipe_cut_short_or_empty_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    assert handed(piped(b"")) is None
    assert "another model file" in caplog.text
    assert handed(piped(state_bytes()[:DIGEST_BYTES + 12])) is None
    assert "truncated" in caplog.text


def test_a_pipe_past_the_bound_is_refused_unread(caplog: pytest.LogCaptureFixture) -> None:
    """The bound is the worker's (state_bytes): it stops reading there."""
    limit = handoff.state_bytes(METADATA, 16)
    fd = piped(header() + bytes(limit))
    assert handoff.handed([fd], DIGEST, 16, lambda: METADATA) is None
    assert "more than a state of this context can take" in caplog.text
    with pytest.raises(ValueError, match="more than"):
        handoff.take(piped(b"x" * 1025), 1024)


def test_a_stalled_pipe_is_refused() -> None:
    read, write = os.pipe()
    os.write(write, b"x")
    try:
        with pytest.raises(ValueError, match="nothing of the state came"):
            handoff.take(read, 1024, idle=0.05)
    finally:
        os.close(read)
        os.close(write)


def test_a_state_larger_than_the_context_holds_is_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    """A sparse 3.9 GiB memfd (no memory behind it) is refused before a
    byte of it is read."""
    fd = os.memfd_create("test-state", os.MFD_ALLOW_SEALING)
    os.write(fd, header() + (4).to_bytes(8, "little"))
    os.ftruncate(fd, 39 << 28)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    assert handed(fd) is None
    assert "more than a state of this context can take" in caplog.text


def test_a_state_of_more_tokens_than_the_context_is_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    fd = memfd_of(Saved(tokens=[7] * N_CTX, data=b"kv"), "test-state", header(), sealed=True)
    assert handed(fd) is None
    assert "the context holds" in caplog.text


def test_the_bound_covers_a_real_state_and_not_much_more() -> None:
    """SmolLM2's f16 KV is 30 layers x 2 x 192 x 2 bytes a token (23 KB):
    the bound holds it in f32 and stays far below the 3.9 GiB above."""
    bound = handoff.state_bytes(METADATA, N_CTX)
    assert N_CTX * 30 * 2 * 192 * 4 < bound < 1 << 30
    # Missing or odd keys fall back to wider shapes, never fail.
    assert handoff.state_bytes({}, N_CTX) > 0
    assert handoff.state_bytes({**METADATA, "llama.attention.head_count_kv": "[3, 3]"},
                               N_CTX) > bound
