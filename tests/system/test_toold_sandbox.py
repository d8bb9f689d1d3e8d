"""toold's unit must leave room for what toold does to its tool processes:
bubblewrap namespaces, Landlock and seccomp. Checked by running probes in
exactly toold's sandbox (the installed unit's [Service] settings, with the
probe as ExecStart=)."""

import contextlib

import pytest

from tests.system.instance import Instance, wait_until

PROBE_DIR = "/run/syntrop-system-test"

#: Landlock (a ruleset that forbids writing files, enforced on itself) and a
#: seccomp filter, through the raw system calls, as pyseccomp/landlock do.
LANDLOCK_SECCOMP = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def fail(what):
    code = ctypes.get_errno()
    print(f"{what}: {errno.errorcode.get(code, code)}")
    sys.exit(3 if code in (errno.EOPNOTSUPP, errno.ENOSYS) else 1)
abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(VERSION)
if abi < 0:
    fail("landlock_create_ruleset")
class Attr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]
attr = Attr(1 << 1)  # LANDLOCK_ACCESS_FS_WRITE_FILE, and no rule allows it
fd = libc.syscall(444, ctypes.byref(attr), ctypes.sizeof(attr), 0)
if fd < 0:
    fail("landlock_create_ruleset")
if libc.syscall(446, fd, 0) != 0:  # landlock_restrict_self
    fail("landlock_restrict_self")
try:
    open("/dev/null", "w")
except PermissionError:
    pass
else:
    print("landlock did not deny a write")
    sys.exit(1)
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
allow = (Filter * 1)(Filter(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
if libc.syscall(317, 1, 0, ctypes.byref(Program(1, allow))) != 0:  # seccomp(SET_MODE_FILTER)
    fail("seccomp")
print(f"landlock abi {abi}, seccomp filter installed")
"""


def probe_unit(instance: Instance, service: str, commands: list[str]) -> str:
    """The installed `service` with its sandbox kept and its job replaced."""
    text = instance.run(["cat", f"/etc/systemd/system/{service}"]).stdout
    out: list[str] = []
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
            if section == "[Install]":
                break
            out.append(line)
            if section == "[Service]":
                out += ["Type=oneshot", *(f"ExecStart={command}" for command in commands)]
            continue
        key = stripped.split("=", 1)[0]
        if section == "[Unit]" and key in ("Requires", "After", "Wants", "Description"):
            continue
        if section == "[Service]" and key in (
            "Type",
            "ExecStart",
            "Restart",
            "RestartSec",
            "WatchdogSec",
            "RuntimeMaxSec",
        ):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def run_probe(
    instance: Instance, name: str, service: str, commands: list[str], expect: str
) -> tuple[str, str]:
    """Start the probe; (its Result, its journal once `expect` shows up or
    after a few seconds)."""
    probe = f"syntrop-probe-{name}.service"
    instance.write(f"/run/systemd/system/{probe}", probe_unit(instance, service, commands))
    try:
        instance.systemctl("daemon-reload")
        instance.systemctl("start", probe, check=False)
        result = instance.show(probe, "Result")["Result"]

        def journal() -> str:
            return instance.run(
                ["journalctl", "--no-pager", "-o", "cat", "-u", probe], check=False
            ).stdout

        with contextlib.suppress(TimeoutError):
            wait_until(f"{expect!r} from {probe}", lambda: expect in journal(), 5)
        output = journal()
        return result, output
    finally:
        instance.run(["rm", "-f", f"/run/systemd/system/{probe}"])
        instance.systemctl("reset-failed", probe, check=False)
        instance.systemctl("daemon-reload")


def test_bubblewrap_runs_in_toolds_sandbox(instance: Instance) -> None:
    if not instance.host_path("/usr/bin/bwrap").exists():
        pytest.skip("bubblewrap is not installed (apt install bubblewrap)")
    result, output = run_probe(
        instance,
        "toold-bwrap",
        "toold.service",
        [
            "/usr/bin/bwrap --unshare-all --die-with-parent --ro-bind / / --ro-bind /proc /proc"
            " --dev /dev --tmpfs /tmp /bin/sh -c 'echo \"sandboxed as $(id -u) on $(hostname)\"'"
        ],
        expect="sandboxed as",
    )
    assert result == "success", output
    assert "sandboxed as 0" in output


def test_landlock_and_seccomp_in_toolds_sandbox(instance: Instance) -> None:
    instance.write(f"{PROBE_DIR}/landlock_seccomp.py", LANDLOCK_SECCOMP)
    result, output = run_probe(
        instance,
        "toold-landlock",
        "toold.service",
        [f"/usr/bin/python3 {PROBE_DIR}/landlock_seccomp.py"],
        expect="landlock",
    )
    if result != "success" and ("EOPNOTSUPP" in output or "ENOSYS" in output):
        pytest.skip(f"the kernel lacks it: {output}")
    assert result == "success", output
    assert "seccomp filter installed" in output
