"""Unit names: syntax, and the allow/deny patterns of toold.toml.

A name is accepted only when it is a plain systemd unit name: letters,
digits and `:_.-` (`@` once, for template instances, `\\` for escapes), a
known type suffix, at most 255 characters, no `/`, no `..`, not starting
with `.` or `-` (except the root mount/slice, which the deny list covers). It
becomes a path component (`<unit>.d`), so anything that could climb or
reach elsewhere is refused before any file is looked at."""

import fnmatch
import re

TYPES = ("service", "socket", "target", "device", "mount", "automount", "swap", "timer",
         "path", "slice", "scope")
_NAME = re.compile(
    r"[A-Za-z0-9:_\\][A-Za-z0-9:_.\\-]*(@[A-Za-z0-9:_.\\-]*)?\.(" + "|".join(TYPES) + r")"
)
PATTERN = _NAME.pattern
MAX = 255


def syntax_error(name: str) -> str | None:
    """Why `name` is not an acceptable unit name, or None."""
    if not name:
        return "empty"
    if len(name) > MAX:
        return f"longer than {MAX} characters"
    if "/" in name or "\0" in name:
        return "contains '/' or NUL"
    if ".." in name:
        return "contains '..'"
    if _NAME.fullmatch(name) is None:
        return "not a unit name (name.type, with letters, digits and :_.-@)"
    return None


def allowed(name: str, allow: tuple[str, ...], deny: tuple[str, ...]) -> bool:
    """On some allow pattern and on no deny pattern (fnmatch, case-sensitive)."""
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in deny):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allow)
