"""routerd: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.system import lazyssl

    lazyssl.defer()  # before anything imports asyncio: ssl only for TLS peers

    from syntrop.routerd.activation import take_http_sockets

    # Before the shared start-up takes the Varlink socket (and unsets
    # LISTEN_*): the HTTP listeners of routerd.socket.
    sockets = take_http_sockets()

    from syntrop.routerd.service import RouterService
    from syntrop.varlink.daemon import run

    run("routerd", "io.syntrop.Router1", lambda paths: RouterService.open(paths, sockets))


if __name__ == "__main__":
    main()
