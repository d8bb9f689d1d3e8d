"""ssl only where TLS is used. asyncio imports ssl at its own import, for
the chance that a connection is TLS; that costs every daemon's cold start
a few milliseconds of CPU and maps libssl and libcrypto (about 4 MiB). Only
routerd ever speaks TLS (its TLS listeners, https upstreams, LAN peers).

`defer()`, called before anything imports asyncio (each daemon's
__main__), makes asyncio treat ssl as absent; `load()` imports it when
needed and hands it to asyncio's modules that looked for it. Code that
imports ssl on its own (the CLI's registry client) runs in other processes.
"""

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
