"""Who is calling: SO_PEERCRED of the connection the current call came in on."""

import contextvars
import socket
import struct
from dataclasses import dataclass

_UCRED = struct.Struct("3i")


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """The credentials the kernel recorded when the peer connected."""

    pid: int
    uid: int
    gid: int


def credentials(sock: socket.socket) -> Peer:
    """The peer's credentials; pid 0 and uid/gid -1 when the kernel has none."""
    try:
        pid, uid, gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
    except OSError:
        return Peer(pid=0, uid=-1, gid=-1)
    return Peer(pid=pid, uid=uid, gid=gid)


_current: contextvars.ContextVar[Peer] = contextvars.ContextVar("syntrop_varlink_peer")


def current_peer() -> Peer:
    """The caller of the method being run. Only valid inside a Varlink method."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_peer() called outside a Varlink method") from None


def set_current(peer: Peer) -> contextvars.Token[Peer]:
    return _current.set(peer)


def reset_current(token: contextvars.Token[Peer]) -> None:
    _current.reset(token)
