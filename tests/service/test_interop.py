"""Every daemon, called by independent Varlink peers: python-varlink's client
and systemd's varlinkctl (including `exec:`, a connected socket)."""

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import varlink
import varlink.error

from syntrop.cli.launcher import DAEMONS, Daemon
from tests.service.wire import (
    Running,
    assert_no_traceback,
    daemon_env,
    idl,
    idl_text,
    streaming,
    valid_parameters,
)

VARLINKCTL_TIMEOUT = 30


def _comment_words(text: str) -> list[str]:
    return [
        word
        for line in text.splitlines()
        if line.strip().startswith("#")
        for word in line.strip().removeprefix("#").split()
    ]


def _varlinkctl(
    binary: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "--no-pager", *args],
        capture_output=True,
        text=True,
        timeout=VARLINKCTL_TIMEOUT,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# python-varlink --------------------------------------------------------------


def test_python_varlink_get_info(served: Running) -> None:
    with (
        varlink.Client(address=served.address) as client,
        client.open("org.varlink.service") as service,
    ):
        info = service.GetInfo()
    assert info["vendor"] == "syntrop"
    assert info["product"] == served.daemon.program
    assert sorted(info["interfaces"]) == sorted([served.daemon.interface, "org.varlink.service"])
    served.assert_healthy()


def test_python_varlink_description_is_the_file_byte_for_byte(served: Running) -> None:
    name = served.daemon.interface
    with varlink.Client(address=served.address) as client:
        with client.open("org.varlink.service") as service:
            description = service.GetInterfaceDescription(interface=name)["description"]
        assert description == idl_text(served.daemon)
        # python-varlink's own parser takes it, with every method of the file.
        parsed = client.get_interface(name)
    assert parsed.name == name
    assert sorted(parsed.members) == sorted(idl(served.daemon).members)


def test_varlinkctl_info(served: Running, varlinkctl_bin: str) -> None:
    result = _varlinkctl(varlinkctl_bin, "info", served.address)
    assert result.returncode == 0, result.stderr
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in result.stdout.splitlines())
        if key.strip()
    )
    assert fields["Vendor"] == "syntrop"
    assert fields["Product"] == served.daemon.program
    assert served.daemon.interface in result.stdout
    assert "org.varlink.service" in result.stdout


def test_varlinkctl_list_interfaces(served: Running, varlinkctl_bin: str) -> None:
    result = _varlinkctl(varlinkctl_bin, "list-interfaces", served.address)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == sorted([served.daemon.interface, "org.varlink.service"])


def test_varlinkctl_introspect_shows_every_doc_comment(
    served: Running, varlinkctl_bin: str
) -> None:
    result = _varlinkctl(varlinkctl_bin, "introspect", served.address, served.daemon.interface)
    assert result.returncode == 0, result.stderr
    shown = [line.strip() for line in result.stdout.splitlines()]
    # varlinkctl re-wraps comments to the terminal width: compare the words.
    assert _comment_words(result.stdout) == _comment_words(idl_text(served.daemon))
    # A field's comment is printed on the line before the field.
    field = re.compile(r"^\w+: \??(\[\w*\])?\w+,?$")
    documented_fields = [
        after
        for before, after in itertools.pairwise(shown)
        if before.startswith("# ") and field.match(after)
    ]
    assert documented_fields, result.stdout[:2000]


def test_varlinkctl_call_get_info_json(served: Running, varlinkctl_bin: str) -> None:
    result = _varlinkctl(
        varlinkctl_bin, "call", "--json=short", served.address, "org.varlink.service.GetInfo", "{}"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["product"] == served.daemon.program


STREAMING = [daemon for daemon in DAEMONS if streaming(daemon)]


@pytest.mark.parametrize("served", STREAMING, indirect=True, ids=lambda daemon: daemon.program)
def test_varlinkctl_streaming_methods_need_more(served: Running, varlinkctl_bin: str) -> None:
    """A streaming method called without --more is refused with the
    declared ExpectedMore, before it runs."""
    daemon = served.daemon
    interface = idl(daemon)
    for name in sorted(streaming(daemon)):
        parameters = json.dumps(valid_parameters(interface, name))
        method = f"{daemon.interface}.{name}"
        result = _varlinkctl(varlinkctl_bin, "call", served.address, method, parameters)
        assert result.returncode != 0
        assert "org.varlink.service.ExpectedMore" in result.stdout + result.stderr, name
    served.assert_healthy()

def test_varlinkctl_call_oneway(served: Running, varlinkctl_bin: str) -> None:
    """--oneway: the daemon answers nothing and goes on serving."""
    result = _varlinkctl(varlinkctl_bin, "call", "--oneway", served.address,
                         "org.varlink.service.GetInfo", "{}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    served.assert_healthy()

def _exec_wrapper(directory: Path, daemon: Daemon) -> Path:
    """An executable for `varlinkctl call exec:PATH` (which passes no
    arguments): it execs the daemon module in place, so the daemon keeps
    the pid varlinkctl put in LISTEN_PID, with stderr to a log."""
    wrapper = directory / f"{daemon.program}-exec"
    log = directory / f"{daemon.program}-exec.log"
    wrapper.write_text(f"#!/bin/sh\nexec 2>>'{log}'\nexec '{sys.executable}' -m {daemon.module}\n")
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.parametrize("daemon", DAEMONS, ids=lambda daemon: daemon.program)
def test_varlinkctl_exec_serves_a_connected_socket(
    daemon: Daemon, varlinkctl_bin: str, tmp_path: Path
) -> None:
    wrapper = _exec_wrapper(tmp_path, daemon)
    env = daemon_env(tmp_path / "root", daemon)
    address = f"exec:{wrapper}"

    # One call per daemon (each starts a daemon).
    result = _varlinkctl(varlinkctl_bin, "call", "--json=short", address,
                         "org.varlink.service.GetInfo", "{}", env=env)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["product"] == daemon.program
    assert daemon.interface in info["interfaces"]

    # The daemon served the socket it was handed; it did not fall back to
    # binding its own under $RUNTIME_DIRECTORY.
    assert not os.path.exists(os.path.join(env["RUNTIME_DIRECTORY"], daemon.interface))
    assert_no_traceback((tmp_path / f"{daemon.program}-exec.log").read_text())
