"""ssl only when TLS is used. Importing ssl (asyncio does, at its own
import) maps libssl and libcrypto: about 4 MiB of routerd's 24 MiB. Before
asyncio is imported, `defer()` keeps it out (asyncio then treats ssl as
absent); `load()` imports it when a TLS upstream or peer is configured and
hands it to asyncio's modules that looked for it."""

import sys
from types import ModuleType


def defer() -> None:
    if "ssl" not in sys.modules and "asyncio" not in sys.modules:
        sys.modules["ssl"] = None  # type: ignore[assignment]


def load() -> ModuleType:
    if sys.modules.get("ssl", False) is None:
        del sys.modules["ssl"]
        import ssl
        from asyncio import base_events, selector_events, sslproto

        for module in (base_events, selector_events, sslproto):
            module.ssl = ssl  # type: ignore[attr-defined]
        sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)
    import ssl

    return ssl


def client_context(ca: str = "", cert: str = "", key: str = "") -> "object":
    """A client context: the system's CAs or `ca`; with `cert` and `key`, a
    client certificate (mutual TLS to LAN peers)."""
    ssl = load()
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


def server_context(cert: str, key: str, client_ca: str) -> "object":
    """A server context that demands a client certificate signed by
    `client_ca` (mutual TLS for LAN peers)."""
    ssl = load()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key or None)
    context.load_verify_locations(cafile=client_ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context
