"""systemd-sentry: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.system import lazyssl

    lazyssl.defer()  # before anything imports asyncio: no daemon but routerd speaks TLS
    from syntrop.sentry.service import SentryService
    from syntrop.varlink.daemon import run

    run("systemd-sentry", "io.syntrop.Sentry1", SentryService.create)


if __name__ == "__main__":
    main()
