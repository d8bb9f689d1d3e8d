"""Debian's version ordering (as `dpkg --compare-versions`): epoch, then the
upstream version, then the revision, each compared in alternating runs of
non-digits (`~` before the end, the end before letters, letters before
everything else) and numbers. toold's downgrade_package chooses a
previous version with it; contextd tells an upgrade from a downgrade in
dpkg's log (which calls both "upgrade")."""

import re

VERSION = re.compile(r"(?:(\d+):)?([0-9][A-Za-z0-9.+~:-]*?)(?:-([A-Za-z0-9.+~]+))?")


def version_error(version: str) -> str | None:
    """Why `version` is not a Debian version, or None."""
    match = VERSION.fullmatch(version)
    if match is None:
        return "is not a Debian version"
    if ":" in match.group(2) and match.group(1) is None:
        return "has a ':' but no epoch"
    if version.endswith("-"):
        return "has an empty revision"
    return None


def split(version: str) -> tuple[int, str, str]:
    """(epoch, upstream version, revision); raises ValueError."""
    if version_error(version):
        raise ValueError(f"{version!r} is not a Debian version")
    epoch = "0"
    if re.match(r"\d+:", version):
        epoch, _, version = version.partition(":")
    upstream, _, revision = version.rpartition("-") if "-" in version else (version, "", "")
    return int(epoch), upstream, revision


def _order(char: str) -> int:
    """A non-digit's weight: `~` before the end, the end before letters,
    letters before everything else."""
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit and digit runs."""
    i = j = 0
    while i < len(a) or j < len(b):
        first = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first:
                first = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first:
            return -1 if first < 0 else 1
    return 0


def compare(a: str, b: str) -> int:
    """Debian's ordering of two versions: -1, 0 or 1 (as `dpkg
    --compare-versions`). Raises ValueError for a non-version."""
    (ea, ua, ra), (eb, ub, rb) = split(a), split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)
