"""units/: shape, `systemd-analyze verify`, and a ceiling on each service's
`systemd-analyze security` exposure (docs/SECURITY.md states the ceilings and
why each unit needs what it keeps)."""

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop.cli.launcher import DAEMONS, Daemon
from syntrop.varlink import authz
from tests.support import REPO

UNITS = REPO / "units"
BINDIR = "/usr/local/bin"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (package systemd)"
)

#: Highest `systemd-analyze security` exposure each service may have (0 best,
#: 10 worst). Raise one only with the reason written in docs/SECURITY.md.
CEILINGS = {
    "inferenced.service": 1.3,
    "modeld.service": 0.5,
    "contextd.service": 0.5,
    "toold.service": 2.2,
    "runtimed.service": 0.8,
    "systemd-sentry.service": 1.3,
    "routerd.service": 1.3,
}

Sections = dict[str, list[tuple[str, str]]]


def parse(path: Path) -> Sections:
    """A unit file as {section: [(key, value), ...]}, keys repeated as written."""
    sections: Sections = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} outside a section"
        assert not line.endswith("\\"), f"{path.name}: keep settings on one line"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(sections: Sections, section: str, key: str) -> list[str]:
    return [value for k, value in sections.get(section, []) if k == key]


def one(sections: Sections, section: str, key: str) -> str:
    found = values(sections, section, key)
    assert len(found) == 1, f"[{section}] {key}= expected once, found {found}"
    return found[0]


def services() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


# --- shape ---------------------------------------------------------------------


def test_one_socket_and_one_service_per_daemon_and_nothing_else() -> None:
    expected = {f"{d.program}.{kind}" for d in DAEMONS for kind in ("socket", "service")}
    expected |= {"syntrop-sockets.target", "ai.slice"}
    assert {path.name for path in UNITS.iterdir()} == expected


ROUTERD_HTTP = ["127.0.0.1:32768", "[::1]:32768", "/run/syntrop/router.sock"]


@pytest.mark.parametrize("daemon", DAEMONS, ids=lambda d: d.program)
def test_socket_unit(daemon: Daemon) -> None:
    unit = parse(UNITS / f"{daemon.program}.socket")
    listen = values(unit, "Socket", "ListenStream")
    assert listen[0] == f"/run/syntrop/{daemon.interface}"
    # routerd's socket unit also carries its HTTP ingress (docs/routerd.md).
    assert listen[1:] == (ROUTERD_HTTP if daemon.program == "routerd" else [])
    assert one(unit, "Socket", "FileDescriptorName") == "varlink"
    assert one(unit, "Socket", "SocketMode") == "0666"
    assert values(unit, "Socket", "Accept") in ([], ["no"])
    assert one(unit, "Unit", "PartOf") == "syntrop-sockets.target"
    assert one(unit, "Install", "WantedBy") == "sockets.target"


@pytest.mark.parametrize("daemon", DAEMONS, ids=lambda d: d.program)
def test_service_unit(daemon: Daemon) -> None:
    unit = parse(UNITS / f"{daemon.program}.service")
    socket = f"{daemon.program}.socket"
    assert socket in one(unit, "Unit", "Requires").split()
    assert socket in one(unit, "Unit", "After").split()
    program, *_ = one(unit, "Service", "ExecStart").split()
    assert program == f"{BINDIR}/{daemon.program}"
    assert one(unit, "Service", "Type") == "notify"
    # /run/syntrop belongs to the socket units: a RuntimeDirectory= there
    # would be removed, sockets and all, when the service stops.
    assert not values(unit, "Service", "RuntimeDirectory")
    assert one(unit, "Service", "UMask") == "0077"
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    assert one(unit, "Service", "ProtectSystem") == "strict"
    assert one(unit, "Service", "MemoryDenyWriteExecute") == "yes"
    assert one(unit, "Service", "SystemCallArchitectures") == "native"
    assert values(unit, "Service", "SystemCallFilter")[0].split()[0] == "@system-service"
    assert values(unit, "Service", "StateDirectory")
    assert one(unit, "Service", "CapabilityBoundingSet") in (
        "",
        "CAP_DAC_OVERRIDE CAP_FOWNER CAP_SETFCAP",
    )


def test_console_scripts_match_the_units() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    for daemon in DAEMONS:
        assert re.search(rf'^{re.escape(daemon.program)} = "', pyproject, re.M), daemon.program


def test_target_wants_every_socket() -> None:
    target = parse(UNITS / "syntrop-sockets.target")
    wanted = set(one(target, "Unit", "Wants").split())
    assert wanted == {f"{daemon.program}.socket" for daemon in DAEMONS}
    assert one(target, "Install", "WantedBy") == "sockets.target"


def test_seed_settings_are_kept() -> None:
    """What the seed (001) asks of each unit, kept or replaced as SECURITY.md says."""
    inferenced = parse(UNITS / "inferenced.service")
    # uid 0 without capabilities: the freezer writes root-owned cgroup files.
    assert "DynamicUser" not in inferenced.get("Service", {})
    assert one(inferenced, "Service", "CapabilityBoundingSet") == ""
    assert one(inferenced, "Service", "DevicePolicy") == "closed"
    assert one(inferenced, "Service", "DeviceAllow") == "char-drm rw"
    assert one(inferenced, "Service", "ProtectControlGroups") == "no"
    assert one(inferenced, "Service", "RestrictAddressFamilies") == "AF_UNIX"
    assert one(inferenced, "Service", "RuntimeMaxSec") == "1800s"
    modeld = parse(UNITS / "modeld.service")
    assert one(modeld, "Service", "StateDirectory") == "syntrop/models"
    assert one(modeld, "Service", "ReadOnlyPaths") == "/usr"
    sentry = parse(UNITS / "systemd-sentry.service")
    assert one(sentry, "Service", "WatchdogSec") == "10s"
    assert one(sentry, "Service", "Restart") == "always"
    assert one(sentry, "Service", "RestrictAddressFamilies") == "AF_UNIX AF_NETLINK"
    routerd = parse(UNITS / "routerd.service")
    for key, value in {
        "Slice": "ai.slice",
        "MemoryHigh": "24M",
        "MemoryMax": "32M",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "OOMScoreAdjust": "-800",
        "RestrictNamespaces": "yes",
        "User": "syntrop-router",
    }.items():
        assert one(routerd, "Service", key) == value, key
    # The daemons that ask polkit run as a static user that reaches the bus,
    # each its own (authz's allow-lists name them), all in the syntrop group.
    users = {"modeld": authz.MODEL_USER, "runtimed": authz.RUNTIME_USER,
             "routerd": authz.ROUTER_USER}
    for name, user in users.items():
        unit = parse(UNITS / f"{name}.service")
        assert one(unit, "Service", "User") == user, name
        assert one(unit, "Service", "Group") == "syntrop", name
        assert "DynamicUser" not in unit.get("Service", {}), name
    install = (REPO / "scripts" / "install").read_text()
    for user in users.values():
        assert f'"{user}:' in install, user  # scripts/install makes it


def test_each_polkit_action_a_daemon_asks_about_is_owned_by_its_account() -> None:
    """polkit answers a non-root daemon about another uid's process only
    where the action names the daemon's account as its owner."""
    import xml.etree.ElementTree as ET

    policy = ET.parse(REPO / "polkit" / "io.syntrop.policy")
    owners = {a.get("id"): {x.text for x in a.iter("annotate")
                            if x.get("key") == "org.freedesktop.policykit.owner"}
              for a in policy.iter("action")}
    assert owners[authz.MANAGE_MODELS] == owners[authz.READ_MODELS] == {
        f"unix-user:{authz.MODEL_USER}"}
    assert owners[authz.MANAGE_RUNTIME] == {f"unix-user:{authz.RUNTIME_USER}"}
    assert owners[authz.MANAGE_ROUTER] == {f"unix-user:{authz.ROUTER_USER}"}


# --- systemd-analyze -------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary root holding the distribution's units, ours in
    /etc/systemd/system, and a stand-in for every ExecStart= program, so that
    verify checks our units and not whether syntrop is installed here."""
    top = tmp_path_factory.mktemp("root")
    for system in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if system.is_dir():
            shutil.copytree(system, top / "usr/lib/systemd/system", symlinks=True)
            break
    units = top / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in UNITS.iterdir():
        shutil.copy2(unit, units / unit.name)
    for service in services():
        program = one(parse(service), "Service", "ExecStart").split()[0]
        stand_in = top / program.lstrip("/")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text("#!/bin/sh\n")
        stand_in.chmod(0o755)
    yield top
    shutil.rmtree(top)


@needs_analyze
def test_systemd_analyze_verify(root: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [
            SYSTEMD_ANALYZE,
            f"--root={root}",
            "verify",
            *sorted(str(p) for p in (root / "etc/systemd/system").iterdir()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # verify only warns (exit 0) about unknown keys and bad values: any
    # output at all is a defect.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


def exposure(service: Path) -> float:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager", str(service)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "SYSTEMD_COLORS": "0", "LANG": "C.UTF-8"},
    )
    match = re.search(
        rf"Overall exposure level for {re.escape(service.name)}: (\d+(?:\.\d+)?)", result.stdout
    )
    assert match, f"no exposure level in:\n{result.stdout[-2000:]}{result.stderr}"
    return float(match.group(1))


@needs_analyze
@pytest.mark.parametrize("service", services(), ids=lambda p: p.stem)
def test_security_exposure_under_ceiling(service: Path) -> None:
    measured = exposure(service)
    ceiling = CEILINGS[service.name]
    assert measured <= ceiling, (
        f"{service.name}: exposure {measured} is above its ceiling {ceiling}; "
        "harden it back, or raise the ceiling with the reason in docs/SECURITY.md"
    )


def test_security_doc_states_every_ceiling() -> None:
    doc = (REPO / "docs" / "SECURITY.md").read_text()
    for name, ceiling in CEILINGS.items():
        row = re.search(rf"^\|\s*{re.escape(name)}\s*\|[^\n]*", doc, re.M)
        assert row, f"docs/SECURITY.md has no table row for {name}"
        assert f"| {ceiling} |" in row.group(0) or f"| {ceiling:.1f} |" in row.group(0), (
            f"docs/SECURITY.md's row for {name} does not state the ceiling {ceiling}"
        )
