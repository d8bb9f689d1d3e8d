"""runtimed: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.runtimed.service import RuntimeService
    from syntrop.varlink.daemon import run

    run("runtimed", "io.syntrop.Runtime1", RuntimeService)


if __name__ == "__main__":
    main()
