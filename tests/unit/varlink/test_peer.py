"""Peer credentials."""

import os
import socket

import pytest

from syntrop.varlink.peer import Peer, credentials


def test_credentials_of_a_socketpair() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert credentials(left) == Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())


def test_current_peer_outside_a_call_is_an_error() -> None:
    from syntrop.varlink.peer import current_peer

    with pytest.raises(RuntimeError):
        current_peer()
