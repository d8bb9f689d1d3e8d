"""Sandboxed child processes: bubblewrap outside, Landlock and seccomp inside.

The daemon never confines itself. It starts a child with `run()`:

    bwrap --unshare-all --die-with-parent --new-session --clearenv
          --ro-bind / / --ro-bind /proc /proc --dev /dev --tmpfs /tmp
          --bind P P (each writable path) --  python -I -m <module>

and the child, once inside, calls `confine()`: a Landlock ruleset (read and
nothing else everywhere; write only beneath the writable paths; execute
nowhere) and then a seccomp filter (no sockets, no exec, no namespaces or
mounts, no ptrace, no kernel keyring or module calls). Landlock comes after
bubblewrap because a Landlock-restricted process may not change its mount
topology, which is bubblewrap's whole job; seccomp comes last because it
forbids what Landlock's set-up needs nothing of, and the child needs to
import its modules before exec-like paths close.

Which layers apply is decided by the caller (`Layers`) from what the host
offers (`available()`); the child reports what it really applied, and that
report, not the request, is what callers record.

Request and reply are one JSON document each, on the child's stdin and
stdout; bubblewrap's and the child's stderr come back for diagnostics.
"""

import contextlib
import errno
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

BWRAP = "/usr/bin/bwrap"
#: Largest reply a child may send (bytes); more is a protocol error.
MAX_REPLY = 4 * 1024 * 1024

#: Calls the seccomp filter answers with EPERM.
DENIED_SYSCALLS = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "execve", "execveat",
    "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount",
    "open_tree", "fsopen", "fsmount", "fsconfig",
    "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime",
    "iopl", "ioperm",
)


class SandboxError(Exception):
    """The child could not be started, died, or answered nonsense."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layers:
    """Which layers to apply to one child."""

    bubblewrap: bool = True
    landlock: bool = True
    seccomp: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Availability:
    """What this host offers; `reasons` says why a layer is missing."""

    bubblewrap: bool
    landlock: bool
    seccomp: bool
    landlock_abi: int = 0
    reasons: dict[str, str] = field(default_factory=dict)


def landlock_abi() -> tuple[int, str]:
    """(ABI version, "") or (0, why not)."""
    try:
        from landlock import landlock_abi_version  # type: ignore[import-untyped]
    except ImportError as error:
        return 0, f"the landlock package is missing: {error}"
    try:
        return int(landlock_abi_version()), ""
    except OSError as error:
        return 0, f"the kernel refuses Landlock: {error.strerror or error}"


def seccomp_status() -> str:
    """"" when a filter can be built here, else why not."""
    try:
        import pyseccomp  # type: ignore[import-untyped]
    except (ImportError, OSError) as error:
        return f"pyseccomp/libseccomp unavailable: {error}"
    try:
        pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    except Exception as error:
        return f"libseccomp cannot build a filter: {error}"
    return ""


def bubblewrap_status(bwrap: str = BWRAP) -> str:
    """"" when `bwrap` exists and can make its namespaces here, else why not."""
    import shutil  # here: it imports bz2, lzma and zlib, ~3 ms of toold's start

    path = shutil.which(bwrap)
    if path is None:
        return f"{bwrap} not found (apt install bubblewrap)"
    import subprocess

    try:
        done = subprocess.run(
            [path, *namespace_arguments(), "--", "/bin/true"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{bwrap} failed to run: {error}"
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["failed"])[-1]
        return f"{bwrap} cannot make its namespaces here: {last}"
    return ""


def available(bwrap: str = BWRAP) -> Availability:
    """Probe the three layers (runs bwrap once; call at start-up, not per action)."""
    reasons: dict[str, str] = {}
    abi, why = landlock_abi()
    if why:
        reasons["landlock"] = why
    why = seccomp_status()
    if why:
        reasons["seccomp"] = why
    why = bubblewrap_status(bwrap)
    if why:
        reasons["bubblewrap"] = why
    return Availability(
        bubblewrap="bubblewrap" not in reasons,
        landlock="landlock" not in reasons,
        seccomp="seccomp" not in reasons,
        landlock_abi=abi,
        reasons=reasons,
    )


def namespace_arguments() -> list[str]:
    """bubblewrap's base: every namespace new, read-only root, a private
    /dev and /tmp, /proc bound read-only (a fresh procfs is refused where
    /proc is over-mounted, as in toold's unit)."""
    return [
        "--unshare-all", "--die-with-parent", "--new-session",
        "--ro-bind", "/", "/",
        "--ro-bind", "/proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
    ]


def command(module: str, writable: list[str], *, layers: Layers,
            bwrap: str = BWRAP, python: str | None = None,
            fds: dict[str, int] | None = None) -> list[str]:
    """The argv that runs `python -I -m module` with `writable` bound
    read-write: by descriptor where `fds` has one for the path (see
    `open_writable`), else by path."""
    interpreter = python or sys.executable
    inner = [interpreter, "-I", "-m", module]
    if not layers.bubblewrap:
        return inner
    argv = [bwrap, *namespace_arguments(), "--clearenv",
            "--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin", "--setenv", "LANG", "C.UTF-8"]
    # The interpreter and the package may live where the sandbox's fresh
    # /tmp hides them (a checkout under /tmp): bind them back, read-only.
    for path in _code_paths(interpreter):
        argv += ["--ro-bind", path, path]
    for path in writable:
        if fds and path in fds:
            argv += ["--bind-fd", str(fds[path]), path]
        else:
            argv += ["--bind", path, path]
    return [*argv, "--", *inner]


def open_writable(writable: list[str]) -> dict[str, int]:
    """Each writable path as an O_PATH descriptor of the directory it is now.

    bubblewrap follows symlinks in a `--bind` source, so a directory checked
    a moment earlier could be swapped for a symlink before it is bound. The
    descriptor is taken without following the last component and compared
    with the path it resolves to; bubblewrap then binds the descriptor
    (`--bind-fd`), never the path again. Raises SandboxError."""
    fds: dict[str, int] = {}
    try:
        for path in writable:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as error:
                raise SandboxError(f"{path}: not a real directory ({error.strerror})") from None
            fds[path] = fd
            if os.readlink(f"/proc/self/fd/{fd}") != os.path.normpath(path):
                raise SandboxError(f"{path}: a symlink lies on its way")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _code_paths(interpreter: str) -> list[str]:
    """Directories under /tmp the child needs to run: the venv, its real
    interpreter, and where this package is imported from."""
    import syntrop

    candidates = {
        os.path.dirname(os.path.dirname(interpreter)),  # the venv (bin/..)
        os.path.dirname(os.path.dirname(os.path.realpath(interpreter))),
        os.path.dirname(os.path.dirname(os.path.abspath(syntrop.__file__))),  # src/
        sys.prefix,
    }
    return sorted(
        path for path in candidates
        if (path == "/tmp" or path.startswith("/tmp/")) and os.path.isdir(path)
    )


async def run(module: str, request: dict[str, Any], *, writable: list[str], layers: Layers,
              bwrap: str = BWRAP, python: str | None = None,
              timeout: float = 30) -> dict[str, Any]:
    """Start the child, send `request` (with the layers to apply added),
    return its JSON reply. Raises SandboxError."""
    fds = open_writable(writable) if layers.bubblewrap else {}
    try:
        return await _run(module, request, writable, layers, bwrap, python, timeout, fds)
    finally:
        for fd in fds.values():
            os.close(fd)


async def _run(module: str, request: dict[str, Any], writable: list[str], layers: Layers,
               bwrap: str, python: str | None, timeout: float,
               fds: dict[str, int]) -> dict[str, Any]:
    import asyncio  # here: the child imports this module and needs no event loop

    argv = command(module, writable, layers=layers, bwrap=bwrap, python=python, fds=fds)
    document = {**request, "writable": writable,
                "layers": {"landlock": layers.landlock, "seccomp": layers.seccomp}}
    env = None if layers.bubblewrap else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                          "LANG": "C.UTF-8"}
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
            pass_fds=tuple(fds.values()),
        )
    except OSError as error:
        raise SandboxError(f"cannot start {argv[0]}: {error.strerror or error}") from None
    try:
        stdout, stderr = await asyncio.wait_for(
            process.communicate(json.dumps(document).encode()), timeout
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise SandboxError(f"the tool process did not finish within {timeout:g} s") from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    tail = stderr.decode(errors="replace").strip()[-2000:]
    if len(stdout) > MAX_REPLY:
        raise SandboxError("the tool process sent an oversized reply")
    try:
        reply = json.loads(stdout or b"null")
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise SandboxError(f"the tool process exited with {process.returncode}: "
                           f"{tail or 'no reply'}")
    reply["stderr"] = tail
    reply["bubblewrap"] = layers.bubblewrap
    return reply


# --- the child's side ------------------------------------------------------


def apply_landlock(writable: list[str]) -> int:
    """Restrict this process: read everything, execute nothing, write only
    beneath `writable`. Returns the ABI used. Raises OSError."""
    from landlock import FSAccess, Ruleset, landlock_abi_version

    abi = int(landlock_abi_version())
    handled = FSAccess.all()
    ruleset = Ruleset(restrict_rules=handled)
    read = FSAccess.READ_FILE | FSAccess.READ_DIR
    ruleset.allow("/", rules=read)
    for path in writable:
        ruleset.allow(path, rules=handled & ~FSAccess.EXECUTE)
    ruleset.apply()
    return abi


def seccomp_filter() -> Any:
    """The filter, built but not loaded: DENIED_SYSCALLS answer EPERM, the
    rest is allowed. Built before Landlock applies, since loading
    libseccomp (ctypes.util.find_library) needs a temporary directory."""
    import pyseccomp

    selected = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        with contextlib.suppress(Exception):  # a call this kernel/arch lacks
            selected.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    return selected


def confine(request: dict[str, Any]) -> list[str]:
    """In the child: apply the layers the request asks for, in order; the
    names of those applied. A layer asked for that fails raises OSError: the
    child must not go on weaker than its parent decided. (bubblewrap is the
    parent's to report: it built the namespaces before this process ran.)"""
    layers = request.get("layers") or {}
    writable = [str(p) for p in request.get("writable") or []]
    applied = []
    selected = seccomp_filter() if layers.get("seccomp") else None
    if layers.get("landlock"):
        apply_landlock(writable)
        applied.append("landlock")
    if selected is not None:
        selected.load()
        applied.append("seccomp")
    return applied
