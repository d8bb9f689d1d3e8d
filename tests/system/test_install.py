"""scripts/install on a systemd host: the instance's installation was made by
it (conftest); these check that running it again is harmless, that it
restores the units and tells systemd, and how it fails."""

import os

from tests.support import REPO
from tests.system.instance import WHEELHOUSE_INSIDE, Instance

INSTALL = str(REPO / "scripts" / "install")


def test_console_scripts_are_linked_into_usr_local_bin(instance: Instance) -> None:
    programs = "inferenced modeld contextd toold runtimed systemd-sentry routerd syn routerctl"
    for name in programs.split():
        link = instance.host_path(f"/usr/local/bin/{name}")
        assert os.readlink(link) == f"/opt/syntrop/bin/{name}"
    interpreter = instance.host_path("/opt/syntrop/pyvenv.cfg").read_text()
    assert "executable = /usr/bin/python3" in interpreter


def test_install_again_restores_units_and_reloads_systemd(instance: Instance) -> None:
    unit = "/etc/systemd/system/ai.slice"
    original = instance.host_path(unit).read_text()
    instance.write(unit, original + "# changed behind syntrop's back\n")
    assert instance.show("ai.slice", "NeedDaemonReload")["NeedDaemonReload"] == "yes"

    result = instance.run([INSTALL, "--wheelhouse", WHEELHOUSE_INSIDE], timeout=300)

    assert result.stdout.startswith("syntrop ") and "installed in /opt/syntrop" in result.stdout
    assert result.stderr == ""
    assert instance.host_path(unit).read_text() == original
    assert instance.show("ai.slice", "NeedDaemonReload")["NeedDaemonReload"] == "no"
    assert instance.systemctl("is-active", "syntrop-sockets.target").strip() == "active"
    for name in ("inferenced", "routerd"):
        assert os.readlink(instance.host_path(f"/usr/local/bin/{name}")).startswith("/opt/syntrop/")


def test_each_daemon_that_is_not_root_has_its_own_account_in_the_syntrop_group(
        instance: Instance) -> None:
    """Made once (the instance's install and test_install_again's run did
    not make them twice); the units run as them."""
    uids = set()
    for user, daemon in (("syntrop-model", "modeld"), ("syntrop-runtime", "runtimed"),
                         ("syntrop-router", "routerd")):
        entries = instance.run(["getent", "passwd", user]).stdout.splitlines()
        assert len(entries) == 1, entries
        uids.add(entries[0].split(":")[2])
        groups = instance.run(["id", "-gn", user]).stdout.split()
        assert groups == ["syntrop"], (user, groups)
        assert instance.show(f"{daemon}.service", "User")["User"] == user
    assert len(uids) == 3, uids


def test_install_fails_in_one_line(instance: Instance) -> None:
    result = instance.run([INSTALL, "--wheelhouse", "/nonexistent"], check=False)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "install: wheelhouse /nonexistent is not a directory\n"
    result = instance.run([INSTALL, "--unitdir", "relative"], check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("install: ")
