"""systemd unit names, what a path in a unit directory is to which unit,
and which files a unit references. Pure functions of strings.

A unit directory holds unit files (foo.service), drop-in directories
(foo.service.d/*.conf, and service.d/ or foo-.service.d/ that apply to many
units), and enablement links (multi-user.target.wants/foo.service). Anything
else there (editor backups, sed's temporary files) systemd ignores, and so
do we.

Relations are index keys. A unit's keys say which events may concern it:
    unit:<name>     its file or its drop-ins (also its template's and prefixes')
    wants:<name>    links that enable it
    path:<file>     a file it references (EnvironmentFile=, a config in ExecStart=)
    ships:<name>    a package that ships its unit file
    owns:<file>     a package that ships a file it references or runs
    pkg:<name>      a package named like it (nginx for nginx.service)
    kernel:unit:<name>  a kernel event naming its cgroup
"""

import re
from dataclasses import dataclass

UNIT_TYPES = (
    "service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path",
    "slice", "scope",
)
MAX_NAME = 255
_CHARS = r"[A-Za-z0-9:_.\\-]"
_UNIT = re.compile(rf"^({_CHARS}+?)(@{_CHARS}*)?\.({'|'.join(UNIT_TYPES)})$")
_LINK_DIRS = (".wants", ".requires", ".upholds")

#: Weight of each relation in GetUnitContext's ranking.
WEIGHTS = {
    "unit": 1.0,
    "template": 0.9,
    "prefix": 0.9,
    "kernel:unit": 0.9,
    "path": 0.85,
    "kernel:pid": 0.8,
    "ships": 0.7,
    "wants": 0.6,
    "owns": 0.6,
    "type": 0.5,
    "pkg": 0.5,
    "kernel": 0.15,
}


def is_unit_name(name: str) -> bool:
    """A unit, template (foo@.service) or instance name systemd accepts."""
    return len(name) <= MAX_NAME and _UNIT.match(name) is not None and ".." not in name


def is_instance_or_plain(name: str) -> bool:
    """A name a unit can have at run time (not a template)."""
    return is_unit_name(name) and "@." not in name


@dataclass(frozen=True, slots=True)
class Role:
    """What a path in a unit directory is.

    kind: unit_file or dropin; unit: the unit (template, prefix) it concerns,
    None for a drop-in of a whole type; key: its index key."""

    kind: str
    unit: str | None
    key: str
    label: str


def role(relative: tuple[str, ...]) -> Role | None:
    """The role of a path, given as its parts below a unit directory; None
    for paths systemd ignores."""
    if len(relative) == 1:
        name = relative[0]
        if is_unit_name(name):
            return Role("unit_file", name, f"unit:{name}", "unit file")
        return None
    if len(relative) != 2:
        return None
    parent, name = relative
    if parent.endswith(".d") and name.endswith(".conf") and not name.startswith("."):
        owner = parent[:-2]
        if owner in UNIT_TYPES:
            return Role("dropin", None, f"unit:*.{owner}", "drop-in")
        if _is_dropin_owner(owner):
            return Role("dropin", owner, f"unit:{owner}", "drop-in")
        return None
    if parent.endswith(_LINK_DIRS) and is_unit_name(name):
        return Role("unit_file", name, f"wants:{name}", "enablement link")
    return None


def _is_dropin_owner(owner: str) -> bool:
    if is_unit_name(owner):
        return True
    # foo-.service.d applies to every foo-*.service.
    stem, dot, kind = owner.rpartition(".")
    return bool(dot) and kind in UNIT_TYPES and stem.endswith("-") and is_unit_name(
        stem[:-1] + "." + kind
    )


def watched_subdir(name: str) -> bool:
    """Whether a directory directly in a unit directory is one we watch."""
    return name.endswith((".d", *_LINK_DIRS)) and not name.startswith(".")


def unit_keys(unit: str) -> dict[str, float]:
    """Index keys of events that may concern `unit`, with their weights."""
    stem, _, kind = unit.rpartition(".")
    keys = {f"unit:{unit}": WEIGHTS["unit"], f"wants:{unit}": WEIGHTS["wants"],
            f"ships:{unit}": WEIGHTS["ships"], f"kernel:unit:{unit}": WEIGHTS["kernel:unit"],
            f"unit:*.{kind}": WEIGHTS["type"], "kernel": WEIGHTS["kernel"]}
    base = stem
    if "@" in stem:
        base, _, _ = stem.partition("@")
        template = f"{base}@.{kind}"
        keys[f"unit:{template}"] = WEIGHTS["template"]
        keys[f"ships:{template}"] = WEIGHTS["ships"]
    parts = base.split("-")
    for end in range(1, len(parts)):
        keys[f"unit:{'-'.join(parts[:end])}-.{kind}"] = WEIGHTS["prefix"]
    keys.setdefault(f"pkg:{base}", WEIGHTS["pkg"])
    return keys


def files_of(unit: str) -> list[tuple[str, ...]]:
    """Relative paths (below any unit directory) of the unit's own file, its
    template's and the drop-in directories that apply to it."""
    stem, _, kind = unit.rpartition(".")
    found: list[tuple[str, ...]] = [(unit,), (f"{unit}.d",)]
    base = stem
    if "@" in stem:
        base = stem.partition("@")[0]
        found += [(f"{base}@.{kind}",), (f"{base}@.{kind}.d",)]
    parts = base.split("-")
    for end in range(1, len(parts)):
        found.append((f"{'-'.join(parts[:end])}-.{kind}.d",))
    found.append((f"{kind}.d",))
    return found


# references ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class References:
    """Files a unit's text names: configs to watch, programs it runs."""

    configs: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()


_EXEC = re.compile(r"^Exec(Start|StartPre|StartPost|Reload|Stop|StopPost|Condition)=")
_MAX_REFERENCES = 32


def references(text: str, prefixes: tuple[str, ...]) -> References:
    """EnvironmentFile= paths, and absolute paths in Exec*= lines: the first
    word is the program; later words (or --opt=/path values) under one of
    `prefixes` are configs."""
    configs: list[str] = []
    programs: list[str] = []
    for line in _logical_lines(text):
        if line.startswith("EnvironmentFile="):
            path = line.partition("=")[2].strip().lstrip("-")
            if path.startswith("/") and "*" not in path:
                configs.append(path)
            continue
        if not _EXEC.match(line):
            continue
        words = line.partition("=")[2].split()
        if not words:
            continue
        program = words[0].lstrip("@-:+!|")
        if program.startswith("/"):
            programs.append(program)
        for word in words[1:]:
            value = word.rpartition("=")[2] if word.startswith("-") else word
            value = value.strip("'\"")
            if value.startswith(prefixes) and "*" not in value:
                configs.append(value)
    return References(
        tuple(dict.fromkeys(p for p in configs if p.startswith(prefixes)))[:_MAX_REFERENCES],
        tuple(dict.fromkeys(programs))[:_MAX_REFERENCES],
    )


def _logical_lines(text: str) -> list[str]:
    """Unit-file lines with continuations joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines
