"""Shadow copies of watched files, and what changed between two of them.

A shadow is what contextd last saw of a path: its type, mode, a digest, and
its text when the text is small enough and the total budget allows. Comparing
the shadow with the file now gives the change: created, modified, deleted or
mode, with a unified diff when both sides have text.

Reading is careful: lstat first; O_NOFOLLOW|O_NONBLOCK so a symlink swapped
in or a FIFO never blocks us; only regular files are read, and at most
max_file_bytes of them for content (a larger file is hashed up to a limit
and never diffed). Binary content (a NUL byte, or not UTF-8) is hashed, not
kept.
"""

import errno
import os
import stat
from dataclasses import dataclass

from syntrop.system.digest import sha256

#: Bytes of a large file hashed to tell whether it changed; past this the
#: size and modification time decide.
HASH_LIMIT = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class FileState:
    """What a path was at one moment.

    kind: file, symlink, dir, other (FIFO, socket, device), unreadable;
    content: the text, when kept; target: a symlink's target."""

    kind: str
    mode: int
    size: int
    mtime_ns: int
    digest: str
    content: bytes | None = None
    target: str | None = None
    binary: bool = False
    error: str | None = None

    def same(self, other: "FileState") -> bool:
        return (self.kind, self.mode, self.digest, self.target) == (
            other.kind, other.mode, other.digest, other.target)


def snapshot(path: str, *, max_file_bytes: int, budget: int) -> FileState | None:
    """The path now; None when it does not exist. Its text is kept when it
    fits in `budget` bytes (what is left of the shadows' total)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as error:
        return _unreadable(error)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            return _unreadable(error)
        return FileState(kind="symlink", mode=mode, size=len(target), mtime_ns=st.st_mtime_ns,
                         digest=str(sha256(os.fsencode(target)).hexdigest()), target=target)
    if stat.S_ISDIR(st.st_mode):
        return FileState(kind="dir", mode=mode, size=0, mtime_ns=st.st_mtime_ns, digest="")
    if not stat.S_ISREG(st.st_mode):
        return FileState(kind="other", mode=mode, size=0, mtime_ns=st.st_mtime_ns, digest="")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:  # became a symlink meanwhile
            return snapshot(path, max_file_bytes=max_file_bytes, budget=budget)
        return _unreadable(error)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return FileState(kind="other", mode=stat.S_IMODE(st.st_mode), size=0,
                             mtime_ns=st.st_mtime_ns, digest="")
        return _read(fd, st, max_file_bytes=max_file_bytes, budget=budget)
    except OSError as error:
        return _unreadable(error)
    finally:
        os.close(fd)


def _read(fd: int, st: os.stat_result, *, max_file_bytes: int, budget: int) -> FileState:
    import hashlib  # here, not at start-up: it maps libcrypto

    hasher = hashlib.sha256()
    head = bytearray()
    total = 0
    while total < HASH_LIMIT:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            break
        hasher.update(chunk)
        if len(head) <= max_file_bytes:
            head += chunk[: max_file_bytes + 1 - len(head)]
        total += len(chunk)
    digest = hasher.hexdigest()
    if total >= HASH_LIMIT:  # too large to hash in full: size and time decide too
        digest += f":{st.st_size}:{st.st_mtime_ns}"
    mode = stat.S_IMODE(st.st_mode)
    if total > max_file_bytes:
        return FileState(kind="file", mode=mode, size=total, mtime_ns=st.st_mtime_ns,
                         digest=digest)
    data = bytes(head)
    binary = b"\0" in data
    if not binary:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            binary = True
    return FileState(kind="file", mode=mode, size=total, mtime_ns=st.st_mtime_ns, digest=digest,
                     content=None if binary or len(data) > budget else data, binary=binary)


def _unreadable(error: OSError) -> FileState:
    reason = error.strerror or type(error).__name__
    return FileState(kind="unreadable", mode=0, size=0, mtime_ns=0, digest=f"error:{reason}",
                     error=reason)


# changes -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """A path that differs from its shadow.

    detail: a short clause for the summary ("+2 -1 lines: +ExecStart=/bin/false",
    "binary, 4096 bytes", "mode 0644 → 0600")."""

    path: str
    action: str
    mode: int | None
    detail: str
    diff: str | None


def compare(path: str, old: FileState | None, new: FileState | None, *,
            max_diff_bytes: int, diff: bool = True) -> Change | None:
    """The change from `old` to `new` (None: absent), or None when the two
    are the same to systemd (type, mode, content, link target). Without
    `diff`, only whether and how it changed (cheap: no diff computed)."""
    if old is None and new is None:
        return None
    if old is not None and new is not None and old.same(new):
        return None
    if new is None:
        assert old is not None
        action, mode = "deleted", old.mode
    elif old is None:
        action, mode = "created", new.mode
    elif (old.kind, old.digest, old.target) == (new.kind, new.digest, new.target):
        return Change(path=path, action="mode", mode=new.mode, diff=None,
                      detail=f"mode {old.mode:04o} → {new.mode:04o}")
    else:
        action, mode = "modified", new.mode
    if not diff:
        return Change(path=path, action=action, mode=mode, diff=None, detail="")
    text, detail = _diff(path, old, new, max_diff_bytes)
    if old is not None and new is not None and old.mode != new.mode:
        detail += f"; mode {old.mode:04o} → {new.mode:04o}"
    return Change(path=path, action=action, mode=mode, diff=text, detail=detail)


def _text(state: FileState | None) -> list[str] | None:
    """The lines a diff shows of `state` ([] for absent), None when it has
    no text to show."""
    if state is None:
        return []
    if state.kind == "symlink":
        return [f"-> {state.target}\n"]
    if state.kind == "file" and state.content is not None:
        return state.content.decode("utf-8").splitlines(keepends=True)
    return None


def _describe(state: FileState) -> str:
    if state.kind == "unreadable":
        return f"unreadable: {state.error}"
    if state.kind == "other":
        return "not a regular file"
    if state.kind == "dir":
        return "a directory"
    if state.binary:
        return f"binary, {state.size} bytes"
    if state.content is None:
        return f"{state.size} bytes, too large to diff"
    return f"{state.size} bytes"


def _telling(line: str) -> bool:
    """A diff line worth quoting in a summary: not blank, a section header
    or a comment."""
    content = line[1:].strip()
    return bool(content) and not content.startswith(("[", "#", ";"))


def _diff(path: str, old: FileState | None, new: FileState | None,
          limit: int) -> tuple[str | None, str]:
    before, after = _text(old), _text(new)
    if before is None or after is None:
        shown = new if new is not None else old
        assert shown is not None
        return None, _describe(shown)
    import difflib  # a diff is made when a file changed, not at start-up

    lines = list(difflib.unified_diff(
        before, after, fromfile="/dev/null" if old is None else f"a{path}",
        tofile="/dev/null" if new is None else f"b{path}", n=3))
    added = [line for line in lines[2:] if line.startswith("+")]
    removed = [line for line in lines[2:] if line.startswith("-")]
    telling = [line for line in added if _telling(line)] or [
        line for line in removed if _telling(line)]
    # Prefer a setting with a value over a reset ("ExecStart=").
    first = next((line for line in telling if not line.rstrip().endswith("=")),
                 telling[0] if telling else None)
    detail = f"+{len(added)} -{len(removed)} lines" if added or removed else "empty"
    if first is not None:
        detail += ": " + first.rstrip("\n")[:120]
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)
    if len(text.encode()) > limit:
        text = text.encode()[:limit].decode("utf-8", "ignore")
        text = text[: text.rfind("\n") + 1] + f"… diff cut at {limit} bytes\n"
    return text or None, detail
