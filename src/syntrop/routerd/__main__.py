"""routerd: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.routerd.service import RouterService
    from syntrop.varlink.daemon import run

    run("routerd", "io.syntrop.Router1", RouterService.open)


if __name__ == "__main__":
    main()
