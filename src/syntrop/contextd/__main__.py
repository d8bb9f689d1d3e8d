"""contextd: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.system import lazyssl

    lazyssl.defer()  # before anything imports asyncio: no daemon but routerd speaks TLS
    import sys

    from syntrop.config import ConfigError, paths
    from syntrop.contextd.config import load

    try:
        load(str(paths().configuration / "contextd.toml"))
    except ConfigError as error:
        # Said once, without a traceback; systemd records the failure.
        print(f"contextd: {error}", file=sys.stderr)
        sys.exit(1)

    from syntrop.contextd.service import ContextService
    from syntrop.varlink.daemon import run

    run("contextd", "io.syntrop.Context1", ContextService.open)


if __name__ == "__main__":
    main()
