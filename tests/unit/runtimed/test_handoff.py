"""A state handed in with a chat (worker/handoff.py's `handed`): taken only
from a sealed memfd no larger than the context can hold, mapped rather than
copied; anything else is left unused (None), never an error."""

import fcntl
import os
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


def test_a_pipe_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    read, write = os.pipe()
    os.close(write)
    assert handed(read) is None
    assert "not a regular file" in caplog.text


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
