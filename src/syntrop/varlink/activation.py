"""Socket activation the way sd-varlink does it.

systemd passes descriptors from fd 3 on, LISTEN_FDS of them, named by
LISTEN_FDNAMES (colon-separated; FileDescriptorName= in the .socket unit).
We take those named "varlink" (or all of them when no names are given), and
look at each: a listening socket (SO_ACCEPTCONN=1, Accept=no) is served with
accept(); a connected one (Accept=yes, or `varlinkctl call exec:…`) is served
directly. We never call listen() on an inherited socket: its backlog is
systemd's to choose.
"""

import os
import socket
from dataclasses import dataclass

SD_LISTEN_FDS_START = 3


@dataclass(frozen=True, slots=True)
class Inherited:
    sockets: list[socket.socket]
    connected: list[socket.socket]


def listen_fds(name: str = "varlink", *, unset_environment: bool = True) -> Inherited | None:
    """The sockets passed to this process, or None without activation.

    Like sd_listen_fds(3) with unset_environment=1, the variables are removed
    so that children we spawn do not think the sockets are theirs.
    """
    try:
        pid = int(os.environ.get("LISTEN_PID", ""))
        count = int(os.environ.get("LISTEN_FDS", ""))
    except ValueError:
        return None
    names_value = os.environ.get("LISTEN_FDNAMES")
    if unset_environment:
        for variable in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(variable, None)
    if pid != os.getpid() or count < 1:
        return None
    names = names_value.split(":") if names_value else []
    listening: list[socket.socket] = []
    connected: list[socket.socket] = []
    for index in range(count):
        fd = SD_LISTEN_FDS_START + index
        if names and (index >= len(names) or names[index] != name):
            continue
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
        if sock.type != socket.SOCK_STREAM:
            sock.detach()
            continue
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            listening.append(sock)
        else:
            connected.append(sock)
    if not listening and not connected:
        return None
    return Inherited(listening, connected)
