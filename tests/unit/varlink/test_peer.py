"""Peer credentials and the permission helper."""

import os
import socket

import pytest
from asyncvarlink.serviceinterface import PermissionDenied

from syntrop.varlink.peer import Peer, credentials, require, reset_current, set_current


def test_credentials_of_a_socketpair() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert credentials(left) == Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())


@pytest.mark.parametrize(
    ("uid", "allowed_uid", "allowed"),
    [(0, None, True), (os.geteuid(), None, True), (4242, 4242, True), (4242, None, False),
     (4242, 4343, False)],
)
def test_require(uid: int, allowed_uid: int | None, allowed: bool) -> None:
    token = set_current(Peer(pid=1, uid=uid, gid=uid))
    try:
        if allowed:
            assert require(uid=allowed_uid).uid == uid
        else:
            with pytest.raises(PermissionDenied):
                require(uid=allowed_uid)
    finally:
        reset_current(token)


def test_current_peer_outside_a_call_is_an_error() -> None:
    from syntrop.varlink.peer import current_peer

    with pytest.raises(RuntimeError):
        current_peer()
