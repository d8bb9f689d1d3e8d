"""The tool process: what toold runs inside bubblewrap to change files.

    python -I -m syntrop.toold.helper   < request.json   > reply.json

It confines itself first (syntrop.system.sandbox.confine: Landlock, then
seccomp), and only then reads what to do. Every path is reached from an
O_DIRECTORY|O_NOFOLLOW walk from /, so no symlink is followed anywhere;
files are written to a temporary name in the same directory, fsynced and
renamed over the old one (atomic; a symlink in the way is replaced, never
followed); the directory is fsynced after.

Actions:
- apply: make entries of one directory what the request says (file with
  content/mode/owner, symlink, or absent);
- mkdir: create one directory in a parent;
- clear: remove everything beneath one directory, the directory stays;
- probe: try things a tool must not be able to do (tests, and `syn` checks).

The reply is {"ok": bool, "applied": [layers], "error": str, ...}.
"""

import base64
import contextlib
import errno
import json
import os
import stat
import sys
from typing import Any

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """The request names something unsafe; nothing was changed."""


def open_dir(path: str) -> int:
    """A dir fd for absolute `path`, refusing a symlink at any component."""
    if not path.startswith("/") or "\0" in path:
        raise Refused(f"not an absolute path: {path!r}")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in [p for p in path.split("/") if p]:
            if part in (".", ".."):
                raise Refused(f"{path}: '.' or '..' component")
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"{path}: {part} is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _name(name: object) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") \
            or "\0" in name or len(name) > 255:
        raise Refused(f"bad file name {name!r}")
    return name


def _write_entry(dfd: int, entry: dict[str, Any]) -> str:
    name = _name(entry.get("name"))
    state = entry.get("state")
    temporary = f".#{name}.{os.urandom(4).hex()}"
    if state == "absent":
        try:
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return ""
        if stat.S_ISDIR(info.st_mode):
            raise Refused(f"{name} is a directory")
        os.unlink(name, dir_fd=dfd)
        return ""
    if state == "symlink":
        os.symlink(str(entry["target"]), temporary, dir_fd=dfd)
        os.rename(temporary, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return ""
    if state != "file":
        raise Refused(f"unknown state {state!r}")
    content = base64.b64decode(str(entry.get("content", "")))
    mode = int(entry.get("mode", 0o644)) & 0o7777
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    warning = ""
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        uid, gid = entry.get("uid"), entry.get("gid")
        if isinstance(uid, int) and isinstance(gid, int):
            info = os.fstat(fd)
            if (info.st_uid, info.st_gid) != (uid, gid):
                try:
                    os.fchown(fd, uid, gid)
                except OSError as error:
                    warning = f"{name}: owner {uid}:{gid} not restored ({error.strerror})"
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dfd)
        raise
    os.close(fd)
    os.rename(temporary, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    return warning


def apply(request: dict[str, Any]) -> dict[str, Any]:
    dfd = open_dir(str(request["directory"]))
    warnings = []
    try:
        for entry in request.get("entries") or []:
            warning = _write_entry(dfd, entry)
            if warning:
                warnings.append(warning)
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return {"warnings": warnings}


def mkdir(request: dict[str, Any]) -> dict[str, Any]:
    dfd = open_dir(str(request["parent"]))
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(_name(request["name"]), int(request.get("mode", 0o755)) & 0o7777, dir_fd=dfd)
        info = os.stat(_name(request["name"]), dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            raise Refused(f"{request['name']} exists and is not a directory")
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return {}


def _clear(dfd: int) -> tuple[int, int]:
    files = size = 0
    for name in os.listdir(dfd):
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            child = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            try:
                more, more_size = _clear(child)
            finally:
                os.close(child)
            files, size = files + more, size + more_size
            os.rmdir(name, dir_fd=dfd)
        else:
            os.unlink(name, dir_fd=dfd)
            files, size = files + 1, size + info.st_size
    return files, size


def clear(request: dict[str, Any]) -> dict[str, Any]:
    dfd = open_dir(str(request["directory"]))
    try:
        files, size = _clear(dfd)
    finally:
        os.close(dfd)
    return {"removed_files": files, "removed_bytes": size}


def _attempt(function: Any) -> str:
    try:
        function()
    except OSError as error:
        return errno.errorcode.get(error.errno or 0, str(error.errno))
    return "ok"


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """Try each thing; "ok" or the errno name."""
    import socket
    import subprocess

    def write(path: str) -> None:
        with open(path, "w") as file:
            file.write("probe\n")

    def connect_unix() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(request.get("unix_socket", "/run/dbus/system_bus_socket")))

    def connect_tcp() -> None:
        with socket.create_connection(("127.0.0.1", int(request.get("tcp_port", 9))), 2):
            pass

    def execute() -> None:
        subprocess.run([str(request.get("binary", "/bin/true"))], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True)

    results = {f"write:{path}": _attempt(lambda path=path: write(path))
               for path in request.get("write_paths") or []}
    if request.get("socket"):
        results["socket"] = _attempt(lambda: socket.socket(socket.AF_UNIX).close())
        results["connect_unix"] = _attempt(connect_unix)
        results["connect_tcp"] = _attempt(connect_tcp)
    if request.get("exec"):
        results["exec"] = _attempt(execute)
    return {"results": results}


ACTIONS = {"apply": apply, "mkdir": mkdir, "clear": clear, "probe": probe}


def main() -> int:
    # Everything this process will import is imported before the filter
    # closes exec and sockets (imports need neither, but keep it obvious).
    import socket  # noqa: F401
    import subprocess  # noqa: F401

    from syntrop.system.sandbox import confine

    raw = sys.stdin.buffer.read(64 * 1024 * 1024)
    reply: dict[str, Any]
    applied: list[str] = []
    try:
        request = json.loads(raw)
        if not isinstance(request, dict):
            raise Refused("the request is not an object")
        applied = confine(request)
        action = ACTIONS.get(str(request.get("action")))
        if action is None:
            raise Refused(f"unknown action {request.get('action')!r}")
        reply = {"ok": True, "applied": applied, "error": "", **action(request)}
    except (Refused, OSError, ValueError, KeyError, TypeError) as error:
        reply = {"ok": False, "applied": applied, "error": str(error)}
    sys.stdout.write(json.dumps(reply))
    sys.stdout.flush()
    return 0 if reply["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
