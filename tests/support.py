"""Starting daemons the way systemd does, for the service tier and benches.

`activated()` runs a daemon under systemd's own systemd-socket-activate
(Accept=no: the daemon gets the listening socket as fd 3 with LISTEN_FDS=1,
LISTEN_FDNAMES=varlink) in a private set of directories, and always kills
what it started. Daemons die with the test process too, even when it
crashes (`dies_with_us`: a parent-death signal that survives exec).
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from syntrop.cli.launcher import DAEMONS, Daemon, daemon_environment

REPO = Path(__file__).resolve().parent.parent
INTERFACES = REPO / "interfaces"
BY_INTERFACE = {daemon.interface: daemon for daemon in DAEMONS}


@dataclass(frozen=True, slots=True)
class Activated:
    daemon: Daemon
    socket: Path
    root: Path
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"


def dies_with_us(argv: list[str]) -> list[str]:
    """`argv` run so that it is killed when this process ends, however it
    ends (util-linux setpriv sets PR_SET_PDEATHSIG, kept across exec of
    non-setuid programs). Start it from the main thread: the signal follows
    the thread that forked."""
    tool = shutil.which("setpriv")
    return [tool, "--pdeathsig", "KILL", *argv] if tool else argv


def environment(root: Path, daemon: Daemon) -> dict[str, str]:
    """The directories systemd would give `daemon`, under `root` (the dev
    launcher's layout)."""
    os.makedirs(root / "run", exist_ok=True)
    return daemon_environment(root, daemon)


@contextlib.contextmanager
def activated(
    daemon: Daemon | str,
    root: Path,
    *,
    idle_timeout: float = 0,
    extra_env: dict[str, str] | None = None,
    stderr: int | None = None,
) -> Iterator[Activated]:
    """Run `daemon` (a Daemon or its program name) socket-activated; its
    stderr goes to `stderr` (a file descriptor) when given."""
    if isinstance(daemon, str):
        daemon = next(d for d in DAEMONS if daemon in (d.program, d.interface))
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        raise RuntimeError("systemd-socket-activate is not installed (package systemd)")
    env = environment(root, daemon)
    sock = root / "run" / daemon.interface
    argv = [
        tool, "-l", str(sock), "--fdname=varlink",
        *(f"-E{key}={value}" for key, value in env.items()),
        f"-ESYNTROP_IDLE_TIMEOUT={idle_timeout}",
        *(f"-E{key}={value}" for key, value in (extra_env or {}).items()),
        "-EPYTHONPATH=" + os.environ.get("PYTHONPATH", ""),
        sys.executable, "-m", daemon.module,
    ]
    process = subprocess.Popen(
        dies_with_us(argv), stdin=subprocess.DEVNULL, stderr=stderr, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while not listening(sock):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{daemon.program} did not bind {sock}")
            time.sleep(0.005)
        yield Activated(daemon, sock, root, process)
    finally:
        stop(process)


def listening(path: Path) -> bool:
    """Whether a Unix socket is bound at `path` AND listening. The file
    appears at bind(), before listen(): a connect in between is refused.
    /proc/net/unix marks listening sockets with __SO_ACCEPTCON (0x10000)."""
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return path.exists()
    target = str(path)
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == target and int(fields[3], 16) & 0x10000:
            return True
    return False


def stop(process: subprocess.Popen[bytes], timeout: float = 5) -> None:
    """SIGTERM, then SIGKILL the process group; never leave it behind."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def varlinkctl() -> str | None:
    """A varlinkctl binary: $VARLINKCTL, one on PATH, or build/varlinkctl
    (made by scripts/fetch-varlinkctl, which `make test` runs)."""
    candidates = [os.environ.get("VARLINKCTL"), shutil.which("varlinkctl"),
                  str(REPO / "build" / "varlinkctl" / "varlinkctl")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def varlink_call(address: str, interface: str, method: str, **params: Any) -> Any:
    """One call through python-varlink (a client that is not ours): the
    reply's parameters. Raises varlink.VarlinkError for an error reply."""
    import varlink

    with varlink.Client(address=address) as client, client.open(interface) as proxy:
        return getattr(proxy, method)(**params)


def declared_error(call: Any, *args: Any, **params: Any) -> tuple[str, dict[str, Any]]:
    """`call(*args, **params)` must answer a Varlink error: its name and
    parameters (the test fails if it answers anything else)."""
    import pytest
    import varlink

    with pytest.raises(varlink.VarlinkError) as caught:
        call(*args, **params)
    return caught.value.error(), caught.value.parameters()


def require_nobody_can_run_us() -> None:
    """Skip, saying why, unless root may act as nobody (uid 65534) with this
    interpreter and checkout: a clone in a directory only root may enter
    (`mktemp -d` makes one 0700) cannot be read as nobody."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    probe = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "import varlink, syntrop, pathlib; import varlink.client as c;"
         "pathlib.Path(c.__file__).with_name('org.varlink.service.varlink').read_text()"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"nobody cannot run this checkout's Python ({last}): "
                    "clone it where every user may read it")


def load_script(name: str) -> "ModuleType":
    """scripts/<name> (a Python program without .py) as a module, for the
    unit tests of its pure parts."""
    import importlib.machinery
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / name
    module_name = name.replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_loader(module_name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
