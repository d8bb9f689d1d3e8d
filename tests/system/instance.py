"""A real systemd booted as PID 1 in a private namespace, for the system tier.

`Instance.boot()` follows the recipe of FACTS.md:

- outer: a cgroup2 child of our own, then
  `timeout -s KILL TTL unshare --fork --kill-child --pid --mount --net --uts
  --ipc --cgroup --mount-proc boot.sh`, so nothing outlives the TTL;
- inner (boot.sh): a tmpfs on the scratch directory, an overlay of / on it,
  a private /dev, read-only /proc/sys and /sys, pure cgroup2 on
  /sys/fs/cgroup, private /run and /tmp, the checkout bound read-only (live,
  never through the overlay's cache), the wheelhouse bound read-only, a boot
  target of our own written into the instance's /run (sysinit, sockets,
  dbus, journald: not the host's enabled units), `pivot_root`, and
  `exec setpriv --bounding-set -sys_module,-sys_time,-sys_rawio,-wake_alarm
  systemd`.

`Instance.close()` kills PID 1 (which takes its whole PID namespace with it),
reaps the `timeout` process, kills whatever is left in the cgroup, removes
the cgroup tree and the scratch directory. It runs on every exit path,
including a failed boot and KeyboardInterrupt, and once more at interpreter
exit as a safety net.

Everything is talked to from the host: commands run inside through nsenter,
Unix sockets are reached at /proc/<pid>/root/run/….
"""

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: Name prefix of our cgroups and scratch directories (never someone else's).
#: Names go on with the owning process's pid: syntrop-system-<pid>-…
PREFIX = "syntrop-system-"
#: The instance's own boot target, written into its /run/systemd/system.
BOOT_TARGET = "syntrop-system-test.target"
#: Where the wheelhouse appears inside the instance.
WHEELHOUSE_INSIDE = "/mnt/syntrop-wheelhouse"
#: Capabilities PID 1 (and so everything under it) never gets.
DROPPED_CAPS = ("sys_module", "sys_time", "sys_rawio", "wake_alarm")
SYSTEMD = "/lib/systemd/systemd"
TOOLS = ("unshare", "nsenter", "timeout", "setpriv", "mount", "pivot_root", "mknod", "systemctl")

_BOOT_SCRIPT = r"""#!/bin/bash
# The inner half of the system tier's instance: runs as PID 1 of a new PID
# namespace, in new mount/net/uts/ipc/cgroup namespaces, and execs systemd.
set -euo pipefail
scratch=$1 checkout=$2 wheelhouse=$3 target=$4

mount --make-rprivate /
mount -t tmpfs -o mode=0700,size=3g syntrop-system "$scratch/mnt"
mkdir "$scratch/mnt/upper" "$scratch/mnt/work" "$scratch/mnt/root"
mount -t overlay overlay \
    -o "lowerdir=/,upperdir=$scratch/mnt/upper,workdir=$scratch/mnt/work" "$scratch/mnt/root"
root=$scratch/mnt/root

# A private /dev, as systemd-nspawn makes it.
mount -t tmpfs -o mode=0755,nosuid,noexec,size=4m dev "$root/dev"
while read -r name major minor; do
    mknod -m 0666 "$root/dev/$name" c "$major" "$minor"
done <<'EOF'
null 1 3
zero 1 5
full 1 7
random 1 8
urandom 1 9
tty 5 0
EOF
touch "$root/dev/console"
mount --bind /dev/null "$root/dev/console"
mkdir -m 0755 "$root/dev/pts" "$root/dev/shm" "$root/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"

# /proc of the new PID namespace, its kernel knobs read-only.
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
for knob in sys sysrq-trigger; do
    [ -e "$root/proc/$knob" ] || continue
    mount --bind "$root/proc/$knob" "$root/proc/$knob"
    mount -o remount,bind,ro "$root/proc/$knob"
done
# /sys read-only; pure cgroup2 of our cgroup namespace, writable.
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
# Private /run and /tmp: the instance's tmpfiles never touch the host's.
mount -t tmpfs -o mode=0755,nosuid,nodev,size=512m run "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=512m tmp "$root/tmp"

# The checkout, live and read-only; the wheelhouse, read-only.
mkdir -p "$root$checkout" "$root/mnt/syntrop-wheelhouse"
mount --bind "$checkout" "$root$checkout"
mount -o remount,bind,ro "$root$checkout"
mount --bind "$wheelhouse" "$root/mnt/syntrop-wheelhouse"
mount -o remount,bind,ro "$root/mnt/syntrop-wheelhouse"

# Boot only what the tests need, not the host's enabled units.
mkdir -p "$root/run/systemd/system"
cat > "$root/run/systemd/system/$target" <<EOF
[Unit]
Description=syntrop system tier
Requires=sysinit.target
Wants=sockets.target dbus.socket dbus.service systemd-journald.service
After=sysinit.target sockets.target dbus.socket systemd-journald.service
AllowIsolate=yes
EOF

cd "$root"
mkdir -p .syntrop-oldroot
pivot_root . .syntrop-oldroot
cd /
umount -l /.syntrop-oldroot
rmdir /.syntrop-oldroot

exec env -i container=syntrop-system-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    setpriv --bounding-set "$5" \
    /lib/systemd/systemd --system --unit="$target" --show-status=no
"""


class BootError(RuntimeError):
    """The instance did not come up; the message carries its boot log."""


def cgroup2_mount() -> Path | None:
    """Where cgroup2 is mounted (from /proc/self/mountinfo), or None."""
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split(" ")[4])
    return None


def own_cgroup(mount: Path) -> Path:
    """Our cgroup2 directory (0::/path in /proc/self/cgroup)."""
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            if line.startswith("0::"):
                return mount / line.strip()[3:].lstrip("/")
    return mount


def unavailable() -> str | None:
    """Why no instance can be booted here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (it boots systemd as PID 1 in private namespaces)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not os.access(SYSTEMD, os.X_OK):
        missing.append(SYSTEMD)
    if missing:
        return f"missing tools: {', '.join(missing)}"
    with open("/proc/filesystems") as filesystems:
        known = filesystems.read().split()
    if "overlay" not in known:
        return "the kernel has no overlayfs"
    mount = cgroup2_mount()
    if mount is None:
        return "no cgroup2 hierarchy is mounted"
    probe = own_cgroup(mount) / f"{owned_prefix()}probe"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        return f"cannot create a cgroup2 child under {probe.parent}: {error.strerror}"
    result = subprocess.run(
        [
            "unshare",
            "--fork",
            "--pid",
            "--mount",
            "--net",
            "--uts",
            "--ipc",
            "--cgroup",
            "--mount-proc",
            "true",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["failed"])[-1]
        return f"cannot unshare pid/mount/net/uts/ipc/cgroup namespaces: {reason}"
    return None


def wait_until(what: str, probe: Callable[[], T | None], timeout: float,
               interval: float = 0.02) -> T:
    """Poll `probe` until it returns something true; its value, or TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s (last: {value!r})")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(child) for child in children.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _kill_cgroup_tree(path: Path) -> None:
    """Thaw, kill and remove a cgroup and its descendants, deepest first."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        (path / "cgroup.freeze").write_text("0")
    killer = path / "cgroup.kill"
    if killer.exists():
        with contextlib.suppress(OSError):
            killer.write_text("1")
    else:  # kernels before 5.14
        for cgroup in [path, *path.rglob("*")]:
            with contextlib.suppress(OSError):
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    # The host's init may reap orphans late: wait for the tree to empty.
    def removed() -> bool:
        for directory in sorted(
            (p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()
        return not path.exists()

    wait_until(f"removal of cgroup {path}", removed, timeout=15)


def owned_prefix() -> str:
    """Prefix of the names this process gives its cgroups and directories."""
    return f"{PREFIX}{os.getpid()}-"


def _owner_gone(name: str) -> bool:
    match = re.fullmatch(rf"{re.escape(PREFIX)}(?:wheels-)?(\d+)-.*", name)
    if match is None:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def reap_stale() -> None:
    """Remove what an earlier run left when it was killed too hard to clean
    up (SIGKILL): its instance (still alive until its TTL), its cgroup and
    its scratch directories. Only names whose owning pid is gone."""
    mount = cgroup2_mount()
    if mount is not None:
        parent = own_cgroup(mount)
        for cgroup in parent.glob(f"{PREFIX}*"):
            if cgroup.is_dir() and _owner_gone(cgroup.name):
                with contextlib.suppress(OSError, TimeoutError):
                    _kill_cgroup_tree(cgroup)
    for scratch in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if scratch.is_dir() and _owner_gone(scratch.name):
            shutil.rmtree(scratch, ignore_errors=True)


class Instance:
    """One booted systemd. Use `boot()`; always `close()` (it is idempotent)."""

    def __init__(self, checkout: Path, wheelhouse: Path, *, ttl: int = 600) -> None:
        self.checkout = checkout.resolve()
        self.wheelhouse = wheelhouse.resolve()
        self.ttl = ttl
        self.scratch: Path | None = None
        self.cgroup: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.started = 0.0  # time.monotonic() at boot
        self.boot_seconds = 0.0
        self.install_seconds = 0.0
        self._closed = False

    # life cycle ----------------------------------------------------------

    def boot(self, timeout: float = 60) -> None:
        atexit.register(self.close)
        started = self.started = time.monotonic()
        try:
            self._start()
            self._wait_running(timeout)
        except BaseException as error:
            log = self.boot_log()
            self.close()
            if isinstance(error, Exception):
                raise BootError(f"{error}\n--- boot log ---\n{log}") from error
            raise
        self.boot_seconds = time.monotonic() - started

    def _start(self) -> None:
        mount = cgroup2_mount()
        if mount is None:
            raise BootError("no cgroup2 hierarchy")
        reap_stale()
        self.scratch = Path(tempfile.mkdtemp(prefix=owned_prefix()))
        (self.scratch / "mnt").mkdir()
        script = self.scratch / "boot.sh"
        script.write_text(_BOOT_SCRIPT)
        script.chmod(0o700)
        self.cgroup = own_cgroup(mount) / self.scratch.name
        self.cgroup.mkdir()
        caps = ",".join(f"-{cap}" for cap in DROPPED_CAPS)
        argv = [
            "timeout",
            "-s",
            "KILL",
            str(self.ttl),
            "unshare",
            "--fork",
            "--kill-child=SIGKILL",
            "--pid",
            "--mount",
            "--net",
            "--uts",
            "--ipc",
            "--cgroup",
            "--mount-proc",
            str(script),
            str(self.scratch),
            str(self.checkout),
            str(self.wheelhouse),
            BOOT_TARGET,
            caps,
        ]
        procs = self.cgroup / "cgroup.procs"
        with open(self.scratch / "boot.log", "wb") as log:
            # The shell joins our cgroup first, so that everything below it,
            # and the cgroup namespace made by unshare, are rooted there.
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def pid1() -> int:
            assert self.process is not None
            if self.process.poll() is not None:
                raise BootError(f"the boot exited with status {self.process.returncode}")
            for unshare in _children(self.process.pid):
                for child in _children(unshare):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{child}/exe").endswith("/systemd"):
                            return child
            return 0

        self.pid = wait_until("systemd exec'd as PID 1", pid1, timeout=30)

    def _wait_running(self, timeout: float) -> None:
        def state() -> str | None:
            if self.process is None or self.process.poll() is not None:
                raise BootError("the instance died while booting")
            result = self.run(["systemctl", "is-system-running"], check=False, timeout=10)
            value = result.stdout.strip()
            return value if value in ("running", "degraded") else None

        value = wait_until("system running", state, timeout)
        if value != "running":
            failed = self.run(["systemctl", "--failed", "--no-legend"], check=False).stdout
            raise BootError(f"system is {value}; failed units:\n{failed}")

    def close(self) -> None:
        """Kill everything the instance consists of and remove its traces.
        SIGINT and SIGTERM wait until it is done (a second Ctrl-C must not
        leave an instance behind); they are delivered right after."""
        if self._closed:
            return
        self._closed = True
        deferred = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
        try:
            self._close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _close(self) -> None:
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        errors: list[str] = []
        if self.pid:
            # PID 1 of the namespace: the kernel kills every process in it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                errors.append(f"timeout process {self.process.pid} did not exit")
        if self.cgroup is not None:
            try:
                _kill_cgroup_tree(self.cgroup)
            except (OSError, TimeoutError) as error:
                errors.append(str(error))
        if self.scratch is not None:
            # Only our own mkdtemp directory; the tmpfs on it lived in the
            # instance's mount namespace and is gone with it.
            shutil.rmtree(self.scratch, ignore_errors=True)
            if self.scratch.exists():
                errors.append(f"could not remove {self.scratch}")
        if errors:
            raise RuntimeError("system tier clean-up: " + "; ".join(errors))

    def boot_log(self) -> str:
        if self.scratch is None:
            return ""
        try:
            return (self.scratch / "boot.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    # talking to it -------------------------------------------------------

    @property
    def root(self) -> Path:
        """The instance's / as seen from the host."""
        return Path(f"/proc/{self.pid}/root")

    def host_path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def nsenter(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-n", "-u", "-i", "-r", "-w"]

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the instance (all its namespaces, its root)."""
        if not self.pid or self._closed:
            raise RuntimeError("the instance is not running")
        if not os.path.exists(f"/proc/{self.pid}"):
            raise RuntimeError(
                f"the instance's systemd (pid {self.pid}) is gone; its time to live is "
                f"{self.ttl} s (SYNTROP_SYSTEM_TTL), {time.monotonic() - self.started:.0f} s "
                "have passed since it booted")
        environment = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "HOME": "/root",
            "SYSTEMD_PAGER": "cat",
            "SYSTEMD_COLORS": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_CACHE_DIR": "1",
            **(env or {}),
        }
        # nsenter forks to enter the PID namespace: on a timeout, its whole
        # process group goes, or the child would hold the pipes open.
        with subprocess.Popen(
            [*self.nsenter(), *argv],
            env=environment,
            text=True,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(input, timeout=timeout)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise
        result = subprocess.CompletedProcess(
            [*self.nsenter(), *argv], process.returncode, stdout, stderr
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"inside the instance, {' '.join(argv)} exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def systemctl(self, *args: str, check: bool = True) -> str:
        return self.run(["systemctl", *args], check=check).stdout

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        out = self.systemctl("show", unit, "-p", ",".join(properties))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_for_unit(self, unit: str, timeout: float = 20, **expected: str) -> dict[str, str]:
        """Poll `systemctl show` until every property has its expected value."""

        def matches() -> dict[str, str] | None:
            shown = self.show(unit, *expected)
            return shown if all(shown.get(k) == v for k, v in expected.items()) else None

        return wait_until(f"{unit} with {expected}", matches, timeout)

    def journal(self, unit: str, lines: int = 50) -> str:
        return self.run(
            ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines), "-u", unit], check=False
        ).stdout

    def call(self, interface: str, method: str, timeout: float = 60, **params: Any) -> Any:
        """Call a daemon of the instance through its activated socket with
        python-varlink's client, on a socket of ours that has a timeout:
        python-varlink's own sockets block forever (it calls
        setblocking(True), so socket.setdefaulttimeout does not reach them),
        and a daemon that never answers must fail the test, not hang it."""
        import socket

        import varlink

        path = str(self.host_path(f"/run/syntrop/{interface}"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            with (
                varlink.Client(address=f"unix:{path}") as client,
                client.open(interface, connection=sock) as proxy,
            ):
                return getattr(proxy, method)(**params)
        finally:
            sock.close()

    def write(self, inside: str, text: str) -> None:
        """Write a file through the instance (never behind the overlay's back)."""
        self.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", inside], input=text)


#: One raw Varlink call on a daemon's socket inside the instance, as whoever
#: runs it (setpriv): argv interface, method, parameters as JSON and, for a
#: streaming method, "more"; prints the (first) reply, error or not, as one
#: JSON line.
RAW_CALL = r"""
import json, socket, sys
interface, method, parameters = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect("/run/syntrop/" + interface)
call = {"method": f"{interface}.{method}", "parameters": parameters}
if sys.argv[4:] == ["more"]:
    call["more"] = True
s.sendall(json.dumps(call).encode() + b"\0")
reply = b""
while not reply.endswith(b"\0"):
    chunk = s.recv(65536)
    if not chunk:
        break
    reply += chunk
print(reply.rstrip(b"\0").decode())
"""


def call_as(instance: "Instance", ids: Sequence[str], interface: str, method: str,
            more: bool = False, **parameters: Any) -> dict[str, Any]:
    """RAW_CALL as `ids` (setpriv's --reuid/--regid/groups options): the
    (first) reply as a dict, {"error": ...} included."""
    import json

    out = instance.run(["setpriv", *ids, "/usr/bin/python3", "-c", RAW_CALL, interface, method,
                        json.dumps(parameters), *(["more"] if more else [])],
                       timeout=60).stdout
    return dict(json.loads(out))


NOBODY = ("--reuid=65534", "--regid=65534", "--clear-groups")


def pull_into_modeld(instance: Instance, path: Path, name: str) -> str:
    """`syn pull PATH --name NAME` inside the instance: its syn reads the
    file and hands modeld a descriptor. A file outside the checkout (which
    the instance sees at the same path) is copied into the instance first.
    Returns syn's output."""
    inside = str(path.resolve())
    if not inside.startswith(str(instance.checkout) + "/"):
        inside = f"/var/tmp/{path.name}"
        shutil.copyfile(path, instance.host_path(inside))
    return instance.run(["syn", "pull", inside, "--name", name], timeout=300).stdout
