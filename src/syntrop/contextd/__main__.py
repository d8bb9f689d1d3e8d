"""contextd: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.contextd.service import ContextService
    from syntrop.varlink.daemon import run

    run("contextd", "io.syntrop.Context1", ContextService)


if __name__ == "__main__":
    main()
