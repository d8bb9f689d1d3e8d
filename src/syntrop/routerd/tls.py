"""routerd's TLS contexts; ssl itself is imported only here, when TLS is
configured (syntrop.system.lazyssl)."""

from syntrop.system.lazyssl import load


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
