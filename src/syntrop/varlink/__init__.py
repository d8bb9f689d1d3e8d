"""The bus: our thin layer over asyncvarlink.

- contract: declaring interfaces (`Interface`, `method`, `implements`)
- idl: rendering them as documented Varlink IDL
- server / daemon / activation: serving them, socket-activated or not
- client: typed clients with timeouts
- peer: the caller's credentials inside a method
- authz: who may call what (root, the owner, or polkit's io.syntrop.* actions)
"""

from asyncvarlink import FileDescriptor, TypedVarlinkErrorReply
from asyncvarlink.serviceinterface import InvalidParameter, MethodNotImplemented, PermissionDenied

from syntrop.varlink.contract import Interface, implements, method
from syntrop.varlink.peer import Peer, current_peer

__all__ = [
    "FileDescriptor",
    "Interface",
    "InvalidParameter",
    "MethodNotImplemented",
    "Peer",
    "PermissionDenied",
    "TypedVarlinkErrorReply",
    "current_peer",
    "implements",
    "method",
]
