"""inferenced: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use."""


def main() -> None:
    from syntrop.system import lazyssl

    lazyssl.defer()  # before anything imports asyncio: no daemon but routerd speaks TLS
    from syntrop.inferenced.service import InferenceService
    from syntrop.varlink.daemon import run

    run("inferenced", "io.syntrop.Inference1", InferenceService.open)


if __name__ == "__main__":
    main()
