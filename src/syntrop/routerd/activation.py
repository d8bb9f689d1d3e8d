"""routerd.socket passes the Varlink socket and the HTTP listeners together.

A socket unit names all its descriptors alike (FileDescriptorName= applies
to the whole unit), so they are told apart by address: the Unix socket named
io.syntrop.Router1 is Varlink, every other listening stream socket is HTTP;
a descriptor named "http" is HTTP whatever its address. The HTTP ones are
taken here, before the shared daemon start-up looks, and renamed "http" in
LISTEN_FDNAMES so that the Varlink server leaves them alone.
"""

import os
import socket

from syntrop.varlink.activation import SD_LISTEN_FDS_START

VARLINK_NAME = "io.syntrop.Router1"


def take_http_sockets() -> list[socket.socket]:
    try:
        pid = int(os.environ.get("LISTEN_PID", ""))
        count = int(os.environ.get("LISTEN_FDS", ""))
    except ValueError:
        return []
    if pid != os.getpid() or count < 1:
        return []
    names = (os.environ.get("LISTEN_FDNAMES") or "").split(":")
    names += ["varlink"] * (count - len(names))
    taken: list[socket.socket] = []
    for index in range(count):
        sock = socket.socket(fileno=SD_LISTEN_FDS_START + index)
        try:
            listening = (sock.type == socket.SOCK_STREAM and bool(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)))
            where = sock.getsockname()
        except OSError:
            listening, where = False, ""
        varlink = (sock.family == socket.AF_UNIX and isinstance(where, str)
                   and os.path.basename(where) == VARLINK_NAME)
        if listening and (names[index] == "http" or not varlink):
            os.set_inheritable(sock.fileno(), False)
            names[index] = "http"
            taken.append(sock)
        else:
            sock.detach()  # the Varlink server's, or not ours to touch
    os.environ["LISTEN_FDNAMES"] = ":".join(names[:count])
    return taken
