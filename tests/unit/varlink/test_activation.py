"""listen_fds() in a child process that really inherits fd 3."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, os
from syntrop.varlink.activation import listen_fds
found = listen_fds()
left = {k: os.environ.get(k) for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")}
print(json.dumps({
    "listening": len(found.sockets) if found else None,
    "connected": len(found.connected) if found else None,
    "left": left,
}))
"""


def probe(env: dict[str, str], *, own_pid: bool = True) -> dict[str, object]:
    """Run PROBE with `sock` as fd 3 and LISTEN_PID set by a shell that execs
    Python (so $$ is Python's pid), the way systemd hands sockets over."""
    pid = "$$" if own_pid else "1"
    script = f'LISTEN_PID={pid} exec "$0" "$@"'
    environment = {**os.environ, **env}
    result = subprocess.run(
        ["/bin/sh", "-c", script, sys.executable, "-c", PROBE],
        env=environment,
        pass_fds=(3,),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(result.stdout))


def test_listening_socket_is_served_with_accept(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(4)
    saved = os.dup(3) if _fd_open(3) else None
    try:
        os.dup2(listener.fileno(), 3)
        out = probe({"LISTEN_FDS": "1", "LISTEN_FDNAMES": "varlink"})
        assert out["listening"] == 1 and out["connected"] == 0
        # Like sd_listen_fds(unset_environment=1): children see nothing.
        assert out["left"] == {"LISTEN_PID": None, "LISTEN_FDS": None, "LISTEN_FDNAMES": None}
        # Another name, or another pid, is not ours.
        assert probe({"LISTEN_FDS": "1", "LISTEN_FDNAMES": "other"})["listening"] is None
        out = probe({"LISTEN_FDS": "1"}, own_pid=False)
        assert out["listening"] is None
    finally:
        _restore(saved)
        listener.close()


def test_connected_socket_is_served_directly() -> None:
    ours, theirs = socket.socketpair()
    saved = os.dup(3) if _fd_open(3) else None
    try:
        os.dup2(ours.fileno(), 3)
        out = probe({"LISTEN_FDS": "1", "LISTEN_FDNAMES": "varlink"})
        assert out["listening"] == 0 and out["connected"] == 1
    finally:
        _restore(saved)
        ours.close()
        theirs.close()


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _restore(saved: int | None) -> None:
    if saved is None:
        os.close(3)
    else:
        os.dup2(saved, 3)
        os.close(saved)
