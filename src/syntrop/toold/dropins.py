"""Drop-in directories: snapshots, the previous version, health.

A snapshot is a list of entries, one per file or symlink of the directory
(JSON-able): {"name", "state": "file", "content" (base64), "mode", "uid",
"gid"} or {"name", "state": "symlink", "target"}. Subdirectories and other
file types are not drop-ins and are left alone (and make the snapshot say so).

The previous version comes from contextd's timeline when it has one: the
newest burst of events on the directory (those within BURST seconds of the
newest) is undone newest first — created → absent, deleted → the diff's old
side, modified → the diff applied in reverse to the current text. Any event
that cannot be undone exactly (no diff, a cut diff, a mode change, text that
no longer matches) makes the whole answer None, and toold's own snapshots
are used instead. Pure functions, except `read_dir`.
"""

import base64
import errno
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

#: Events this close to the newest one count as one change (an editor's
#: save is often several writes).
BURST_USEC = 2_000_000
MAX_FILES = 256
MAX_FILE_BYTES = 1024 * 1024

Entry = dict[str, Any]


class UnsafeDirectory(Exception):
    """The directory is a symlink, not a directory, or holds too much."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One event of contextd's timeline about a file of the directory."""

    name: str
    action: str  # created, modified, deleted, mode
    timestamp_usec: int
    diff: str | None


def read_dir(path: str) -> tuple[bool, list[Entry]]:
    """(exists, entries). Never follows a symlink; raises UnsafeDirectory."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False, []
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeDirectory("is a symlink")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory("is not a directory")
    try:
        dfd = os.open(path, flags)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeDirectory("changed into a symlink while being read") from None
        raise
    entries: list[Entry] = []
    try:
        names = sorted(os.listdir(dfd))
        if len(names) > MAX_FILES:
            raise UnsafeDirectory(f"holds more than {MAX_FILES} entries")
        for name in names:
            entry = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(entry.st_mode):
                entries.append({"name": name, "state": "symlink",
                                "target": os.readlink(name, dir_fd=dfd)})
            elif stat.S_ISREG(entry.st_mode):
                if entry.st_size > MAX_FILE_BYTES:
                    raise UnsafeDirectory(f"{name} is larger than {MAX_FILE_BYTES} bytes")
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    content = os.read(fd, MAX_FILE_BYTES + 1)
                finally:
                    os.close(fd)
                entries.append({"name": name, "state": "file",
                                "content": base64.b64encode(content).decode(),
                                "mode": stat.S_IMODE(entry.st_mode),
                                "uid": entry.st_uid, "gid": entry.st_gid})
            else:
                raise UnsafeDirectory(f"{name} is neither a file nor a symlink")
    finally:
        os.close(dfd)
    return True, entries


def text_of(entry: Entry | None) -> str | None:
    if entry is None or entry.get("state") != "file":
        return None
    try:
        return base64.b64decode(str(entry["content"])).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def file_entry(name: str, text: str, like: Entry | None = None) -> Entry:
    return {"name": name, "state": "file", "content": base64.b64encode(text.encode()).decode(),
            "mode": (like or {}).get("mode", 0o644), "uid": (like or {}).get("uid", 0),
            "gid": (like or {}).get("gid", 0)}


def changes(current: list[Entry], target: list[Entry]) -> list[Entry]:
    """What to write so that `current` becomes `target`: changed or new
    entries of target, and {"state": "absent"} for names target lacks."""
    now = {e["name"]: e for e in current}
    wanted = {e["name"]: e for e in target}
    out = [e for name, e in sorted(wanted.items()) if now.get(name) != e]
    out += [{"name": name, "state": "absent"} for name in sorted(now) if name not in wanted]
    return out


def describe(change: list[Entry]) -> list[str]:
    """One line per entry of a change, for plans and audit records."""
    lines = []
    for entry in change:
        if entry["state"] == "absent":
            lines.append(f"remove {entry['name']}")
        elif entry["state"] == "symlink":
            lines.append(f"make {entry['name']} a symlink to {entry['target']}")
        else:
            size = len(base64.b64decode(str(entry["content"])))
            lines.append(f"write {entry['name']} ({size} bytes, mode {entry['mode']:04o})")
    return lines


_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def reverse_patch(after: str, diff: str) -> str | None:
    """The text before a unified diff, given the text after it; None when
    the diff does not fit `after` exactly or is not a plain unified diff."""
    hunks: list[tuple[int, int, list[str], list[str]]] = []
    old: list[str] = []
    new: list[str] = []
    current: tuple[int, int] | None = None
    last: list[list[str]] = []

    def close() -> None:
        if current is not None:
            hunks.append((current[0], current[1], list(old), list(new)))

    for line in diff.splitlines(keepends=True):
        if line.startswith(("--- ", "+++ ")) and current is None:
            continue
        match = _HUNK.match(line)
        if match:
            close()
            old.clear()
            new.clear()
            start, count = int(match.group(3)), int(match.group(4) or "1")
            current = (start, count)
            continue
        if current is None:
            return None
        if line.startswith("\\"):  # "\ No newline at end of file": the line before has none
            for side in last:
                if side and side[-1].endswith("\n"):
                    side[-1] = side[-1][:-1]
            continue
        body = line[1:]
        if line.startswith(" "):
            old.append(body)
            new.append(body)
            last = [old, new]
        elif line.startswith("-"):
            old.append(body)
            last = [old]
        elif line.startswith("+"):
            new.append(body)
            last = [new]
        else:
            return None
    close()
    return _unapply(after, hunks)


def _unapply(after: str, hunks: list[tuple[int, int, list[str], list[str]]]) -> str | None:
    """`after` with each hunk's new lines put back to its old ones; None
    when a hunk's new lines are not where it says."""
    lines = after.splitlines(keepends=True)
    out: list[str] = []
    position = 0
    for start, count, old_lines, new_lines in hunks:
        if count != len(new_lines):
            return None
        index = start - 1 if count else start
        if index < position or lines[index:index + count] != new_lines:
            return None
        out += lines[position:index]
        out += old_lines
        position = index + count
    out += lines[position:]
    return "".join(out)


def undo(current: list[Entry], events: list[Change]) -> list[Entry] | None:
    """The directory before the newest burst of `events`, or None when one
    of them cannot be undone exactly. `events` may be in any order."""
    if not events:
        return None
    ordered = sorted(events, key=lambda e: e.timestamp_usec, reverse=True)
    newest = ordered[0].timestamp_usec
    state = {e["name"]: e for e in current}
    for event in ordered:
        if newest - event.timestamp_usec > BURST_USEC:
            break
        entry = state.get(event.name)
        if event.action == "created":
            state.pop(event.name, None)
        elif event.action in ("modified", "deleted") and event.diff:
            after = "" if event.action == "deleted" else text_of(entry)
            if after is None:
                return None
            before = reverse_patch(after, event.diff)
            if before is None:
                return None
            state[event.name] = file_entry(event.name, before, entry)
        else:
            return None
    return [state[name] for name in sorted(state)]


HEALTH = {"active": 3, "reloading": 2, "activating": 1, "deactivating": 1, "inactive": 1,
          "failed": 0}


def health(active_state: str, result: str = "") -> int:
    """A unit's health as a number: higher is better. A unit that is
    inactive after a clean exit (a oneshot that ran) counts as working."""
    if active_state == "inactive" and result == "success":
        return 2
    return HEALTH.get(active_state, 0)
