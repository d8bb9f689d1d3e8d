"""Reading the journal through journalctl --output=json.

journalctl seeks by time (--since/--until bisect the entry arrays) and by
field (matches use the journal's hash tables), so a slice costs the same on
a small journal and on a large one. These helpers stop reading once they
have what they need, so a broad match never turns into a full scan.

`read()` is blocking (run it in a thread); `follow()` is a coroutine
generator over `journalctl --follow` for a long-running reader.
"""

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

#: Longest line accepted from journalctl (an entry with a huge field).
MAX_LINE = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """Which journal to read: the system's (neither set), a directory
    (--directory) or files (--file, repeatable)."""

    journalctl: str = "journalctl"
    directory: str | None = None
    files: tuple[str, ...] = ()

    def argv(self, *args: str) -> list[str]:
        command = [self.journalctl, "--no-pager", "--quiet", "--output=json"]
        if self.directory:
            command.append(f"--directory={self.directory}")
        command.extend(f"--file={path}" for path in self.files)
        command.extend(args)
        return command

    @property
    def can_follow(self) -> bool:
        # journalctl cannot --follow a --file (no journal fd to wait on).
        return not self.files


@dataclass(slots=True)
class Result:
    """Entries read (parsed JSON objects), lines that were not, and an error
    when journalctl could not be run or failed."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    error: str | None = None


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One line of journalctl --output=json, or None when it is not one."""
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def read(argv: Sequence[str], *, limit: int, timeout: float = 5.0) -> Result:
    """Run journalctl `argv` and parse at most `limit` entries; the process
    is killed once enough were read or after `timeout` seconds."""
    result = Result()
    deadline = time.monotonic() + timeout
    try:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "SYSTEMD_COLORS": "0"},
        )
    except OSError as error:
        result.error = f"cannot run {argv[0]}: {error.strerror}"
        return result
    assert process.stdout is not None and process.stderr is not None
    try:
        while len(result.entries) < limit:
            if time.monotonic() > deadline:
                result.error = f"journalctl took longer than {timeout:g} s"
                break
            line = process.stdout.readline(MAX_LINE)
            if not line:
                break
            entry = parse_line(line)
            if entry is None:
                result.skipped += 1
            else:
                result.entries.append(entry)
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        stderr = process.stderr.read(4096).decode(errors="replace").strip()
        process.stderr.close()
        code = process.wait()
    if code not in (0, -9) and not result.entries and result.error is None:
        result.error = stderr.splitlines()[-1] if stderr else f"journalctl exited with {code}"
    return result


async def follow(argv: Sequence[str]) -> AsyncIterator[dict[str, Any] | None]:
    """Entries of `journalctl … --follow` as they come (None for a line that
    is not JSON). Ends when journalctl exits; kills it when the consumer
    stops. Raises OSError when it cannot be started."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, limit=MAX_LINE, env={**os.environ, "SYSTEMD_COLORS": "0"},
    )
    assert process.stdout is not None
    try:
        while True:
            try:
                line = await process.stdout.readline()
            except ValueError:  # a line past MAX_LINE: skip it
                yield None
                continue
            if not line:
                break
            yield parse_line(line)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()
