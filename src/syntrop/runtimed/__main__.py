"""runtimed: start-up only. Imports stay inside main() so socket activation
pays for nothing it does not use.

`runtimed verify MODEL_PATH …` checks a model file with the numpy oracle
(syntrop.runtimed.oracle.cli) instead of serving; `runtimed engine
[--json] [--force-amx]` prints which CPU code the engine would run here and
why (syntrop.runtimed.cpu); every other command line starts the daemon."""

import sys


def main() -> None:
    from syntrop.system import lazyssl

    lazyssl.defer()  # before anything imports asyncio: no daemon but routerd speaks TLS
    if sys.argv[1:2] == ["verify"]:
        from syntrop.runtimed.oracle.cli import main as verify

        sys.exit(verify(sys.argv[2:]))
    if sys.argv[1:2] == ["engine"]:
        from syntrop.runtimed.cpu import main as engine

        sys.exit(engine(sys.argv[2:]))

    from syntrop.runtimed.service import RuntimeService
    from syntrop.varlink.daemon import run

    run("runtimed", "io.syntrop.Runtime1", RuntimeService)


if __name__ == "__main__":
    main()
