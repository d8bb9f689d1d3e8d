"""Package history: dpkg.log, apt's history.log and dnf.rpm.log parsed into
package records. Pure functions of text; times are converted with the
functions passed in (dpkg and apt write local time).

A line (or an apt stanza) in an unexpected format is skipped and counted,
never an error.
"""

import calendar
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from syntrop.system.debian import compare

#: Local "YYYY-MM-DD HH:MM:SS" → microseconds since the epoch.
LocalTime = Callable[[str], int | None]


def local_time(text: str) -> int | None:
    try:
        parsed = time.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return int(time.mktime(parsed)) * 1_000_000


def utc_time(text: str) -> int | None:
    """For tests: the same format read as UTC."""
    try:
        parsed = time.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return calendar.timegm(parsed) * 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class PackageRecord:
    """One package decision.

    action: install, upgrade, downgrade, reinstall, remove, purge, conffile
    (path and decision set) or transaction (an apt run: command and packages)."""

    timestamp_usec: int
    action: str
    package: str | None
    arch: str | None = None
    old_version: str | None = None
    new_version: str | None = None
    path: str | None = None
    decision: str | None = None
    command: str | None = None
    packages: tuple[str, ...] = ()
    summary: str = ""


@dataclass(slots=True)
class Parsed:
    records: list[PackageRecord]
    skipped: int = 0


# dpkg.log ------------------------------------------------------------------

_DPKG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (\S+) (.*)$")
_DPKG_QUIET = {"status", "configure", "trigproc", "startup"}
_NONE = "<none>"


def _split_package(spec: str) -> tuple[str, str | None]:
    name, _, arch = spec.partition(":")
    return name, arch or None


def _version(value: str) -> str | None:
    return None if value == _NONE else value


def _older(new: str, old: str) -> bool:
    """Whether version `new` orders before `old` (False where either is
    not a Debian version: then the log's word stands)."""
    try:
        return compare(new, old) < 0
    except ValueError:
        return False


def parse_dpkg(text: str, to_usec: LocalTime = local_time) -> Parsed:
    """dpkg.log lines: install / upgrade / remove / purge / conffile become
    records; status, configure, trigproc and startup lines are known and
    ignored; anything else is skipped. dpkg writes a package's conffile
    decisions while configuring it, after its `configure` line: that names
    the package a conffile record belongs to."""
    parsed = Parsed([])
    configuring: tuple[str, str | None] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _DPKG.match(line)
        if match is None:
            parsed.skipped += 1
            continue
        stamp, verb, rest = match.groups()
        usec = to_usec(stamp)
        words = rest.split()
        if usec is None:
            parsed.skipped += 1
        elif verb in _DPKG_QUIET:
            if verb == "configure" and words:
                configuring = _split_package(words[0])
            elif verb == "startup":
                configuring = None
            continue
        elif verb in ("install", "upgrade", "remove", "purge") and len(words) == 3:
            name, arch = _split_package(words[0])
            old, new = _version(words[1]), _version(words[2])
            action = verb
            if verb == "upgrade" and old is not None and old == new:
                action = "reinstall"
            elif verb == "upgrade" and old is not None and new is not None and _older(new, old):
                action = "downgrade"  # dpkg's log calls both "upgrade"
            parsed.records.append(PackageRecord(
                timestamp_usec=usec, action=action, package=name, arch=arch,
                old_version=old, new_version=new,
                summary=_package_summary(action, name, old, new)))
        elif verb == "conffile" and len(words) == 2 and words[0].startswith("/"):
            path, decision = words
            what = ("installed the package's version" if decision == "install"
                    else "kept the local one")
            owner, owner_arch = configuring if configuring is not None else (None, None)
            of = f" of {owner}" if owner else ""
            parsed.records.append(PackageRecord(
                timestamp_usec=usec, action="conffile", package=owner, arch=owner_arch, path=path,
                decision=decision, summary=f"dpkg conffile {path}{of}: {what}"))
        else:
            parsed.skipped += 1
    return parsed


def _package_summary(action: str, name: str, old: str | None, new: str | None) -> str:
    if action in ("upgrade", "downgrade"):
        return f"package {name} {action}d {old} → {new}"
    if action == "install":
        return f"package {name} {new} installed"
    if action == "reinstall":
        return f"package {name} {new or old} reinstalled"
    return f"package {name} {old or ''} {'purged' if action == 'purge' else 'removed'}".replace(
        "  ", " ")


# apt history.log -----------------------------------------------------------

_APT_LISTS = {
    "Install": "install", "Upgrade": "upgrade", "Downgrade": "downgrade",
    "Reinstall": "reinstall", "Remove": "remove", "Purge": "purge",
}
_APT_ENTRY = re.compile(r"\s*([^\s,()]+) \(([^()]*)\)")


_END = re.compile(rb"^End-Date:[^\n]*\n", re.M)


def apt_complete(data: bytes) -> int:
    """Bytes of history.log up to the end of its last complete stanza (one
    still being written is read later)."""
    last = 0
    for match in _END.finditer(data):
        last = match.end()
    return last


def split_apt(text: str) -> list[str]:
    """The stanzas of complete history.log text."""
    stanzas = []
    position = 0
    for match in re.finditer(r"^End-Date:[^\n]*\n", text, flags=re.M):
        stanzas.append(text[position:match.end()])
        position = match.end()
    return stanzas


def parse_apt(stanzas: list[str], to_usec: LocalTime = local_time) -> Parsed:
    """One transaction record per stanza; a stanza without a readable
    Start-Date or without any package is skipped."""
    parsed = Parsed([])
    for stanza in stanzas:
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(": ")
            if sep:
                fields[key.strip()] = value.strip()
        usec = to_usec(" ".join(fields.get("Start-Date", "").split()))
        changes: list[tuple[str, str, str]] = []  # (action, package, versions)
        for key, action in _APT_LISTS.items():
            for spec, versions in _APT_ENTRY.findall(fields.get(key, "")):
                changes.append((action, spec, versions))
        if usec is None or not changes:
            parsed.skipped += 1
            continue
        command = fields.get("Commandline", "apt")
        shown = ", ".join(f"{action} {_split_package(spec)[0]}" for action, spec, _ in changes[:8])
        more = f" and {len(changes) - 8} more" if len(changes) > 8 else ""
        parsed.records.append(PackageRecord(
            timestamp_usec=usec, action="transaction", package=None, command=command,
            packages=tuple(dict.fromkeys(name for _, name, _ in changes)),
            summary=f"apt transaction `{command[:80]}`: {shown}{more}"))
    return parsed


# dnf.rpm.log ---------------------------------------------------------------

_DNF = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:?\d\d)) \w+ (\w+): (\S+)\s*$")
_DNF_ACTIONS = {
    "Installed": "install", "Upgrade": "upgrade", "Downgrade": "downgrade",
    "Reinstall": "reinstall", "Erase": "remove", "Obsoleted": "remove",
}
_DNF_QUIET = {"Upgraded", "Downgraded", "Reinstalled", "Obsolete", "Cleanup"}


def split_nevra(nevra: str) -> tuple[str, str, str | None] | None:
    """name-[epoch:]version-release.arch → (name, version-release, arch)."""
    parts = nevra.rsplit("-", 2)
    if len(parts) != 3 or not all(parts):
        return None
    name, version, release_arch = parts
    release, dot, arch = release_arch.rpartition(".")
    if not dot:
        return name, f"{version}-{release_arch}", None
    return name, f"{version}-{release}", arch


def parse_dnf(text: str) -> Parsed:
    parsed = Parsed([])
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _DNF.match(line)
        if match is None:
            parsed.skipped += 1
            continue
        stamp, verb, nevra = match.groups()
        if verb in _DNF_QUIET:
            continue
        action = _DNF_ACTIONS.get(verb)
        split = split_nevra(nevra)
        try:
            when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            when = None
        if action is None or split is None or when is None:
            parsed.skipped += 1
            continue
        name, version, arch = split
        usec = int(when.timestamp()) * 1_000_000
        old, new = (version, None) if action == "remove" else (None, version)
        parsed.records.append(PackageRecord(
            timestamp_usec=usec, action=action, package=name, arch=arch, old_version=old,
            new_version=new, summary=_package_summary(action, name, old, new)))
    return parsed


# what a package ships ------------------------------------------------------

_UNIT_DIR = re.compile(r"/systemd/(system|user)/([^/]+)$")
MAX_SHIPPED = 64


def shipped(listing: str, wanted: Callable[[str], bool]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """From a dpkg .list file: the unit files it ships (names), and the
    files `wanted` picks (programs and configs some unit names); at most
    MAX_SHIPPED of each."""
    units: list[str] = []
    files: list[str] = []
    for line in listing.splitlines():
        path = line.strip()
        match = _UNIT_DIR.search(path)
        if match and "." in match.group(2):
            if len(units) < MAX_SHIPPED:
                units.append(match.group(2))
        elif wanted(path) and len(files) < MAX_SHIPPED:
            files.append(path)
    return tuple(dict.fromkeys(units)), tuple(dict.fromkeys(files))


# which files a package ships (dpkg's database) -------------------------------

_PROGRAM_DIRS = ("/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/", "/usr/libexec/")


class PackageFiles:
    """What installed packages ship, from <dpkg info>/<name>[:<arch>].list:
    unit file names, and files under the configured prefixes or in program
    directories. Cached until dpkg's info directory changes (dpkg replaces
    lists by renaming, which changes the directory); thread-safe."""

    def __init__(self, info_dir: str, prefixes: tuple[str, ...], *, capacity: int = 8192) -> None:
        self.info_dir = info_dir
        self.prefixes = prefixes
        self.capacity = capacity
        self._cache: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        self._version: int | None = None
        self._lock = threading.Lock()

    def _wanted(self, path: str) -> bool:
        return path.startswith(self.prefixes) or path.startswith(_PROGRAM_DIRS)

    def refresh(self) -> None:
        """Forget what was read if dpkg changed its database since."""
        try:
            version = os.stat(self.info_dir).st_mtime_ns
        except OSError:
            version = None
        with self._lock:
            if version != self._version or len(self._cache) > self.capacity:
                self._cache.clear()
                self._version = version

    def cached(self, specs: set[str]) -> bool:
        """Whether `of()` answers all of these from memory."""
        with self._lock:
            return specs.issubset(self._cache)

    def of(self, spec: str) -> tuple[frozenset[str], frozenset[str]]:
        """(unit names, files) of package `spec` (name or name:arch); empty
        when dpkg does not know it (removed, or not a dpkg system)."""
        with self._lock:
            cached = self._cache.get(spec)
        if cached is not None:
            return cached
        name, _, arch = spec.partition(":")
        value: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        for candidate in ([f"{name}:{arch}.list", f"{name}.list"] if arch else [f"{name}.list"]):
            try:
                with open(os.path.join(self.info_dir, candidate), encoding="utf-8",
                          errors="replace") as file:
                    listing = file.read(4 * 1024 * 1024)
            except OSError:
                continue
            units, files = shipped(listing, self._wanted)
            value = (frozenset(units), frozenset(files))
            break
        with self._lock:
            self._cache[spec] = value
        return value
