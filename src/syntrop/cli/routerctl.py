"""routerctl: operate routerd through io.syntrop.Router1.

    routerctl status     uptime, ingress, memory, pressure, totals

Commands answer with routerd's own error while it does not implement them.
"""

import argparse
import asyncio
import json
import sys
from typing import Any


async def _call(method: str, **params: Any) -> Any:
    from syntrop.interfaces.router import Router1
    from syntrop.varlink.client import connect

    async with await connect(Router1) as router:
        return await getattr(router, method)(**params)


def main(argv: list[str] | None = None) -> None:
    top = argparse.ArgumentParser(prog="routerctl", description="Operate routerd.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("status", help="routerd's status")
    commands.add_parser("providers", help="configured providers")
    commands.add_parser("models", help="reachable models")
    commands.add_parser("reload", help="re-read the configuration")
    args = top.parse_args(argv)
    method = {
        "status": "GetStatus",
        "providers": "ListProviders",
        "models": "ListModels",
        "reload": "Reload",
    }[args.command]
    from asyncvarlink import VarlinkErrorReply

    try:
        result = asyncio.run(_call(method))
    except VarlinkErrorReply as error:
        print(f"routerctl: routerd answered {error.name}", file=sys.stderr)
        sys.exit(1)
    except OSError as error:
        print(f"routerctl: cannot reach routerd: {error}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result, default=str, indent=2))


if __name__ == "__main__":
    main()
