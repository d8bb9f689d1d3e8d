"""routerctl: operate routerd through io.syntrop.Router1.

    routerctl status                 uptime, ingress, memory, pressure, totals
    routerctl providers              configured providers and their health
    routerctl test PROVIDER          probe a provider now
    routerctl models                 reachable models, aliases, default
    routerctl route MODEL [--explain] [--prompt-tokens N] [--messages FILE]
                                     how a request would be routed
    routerctl reload                 re-read routerd.toml and model lists
"""

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Router1Client
    from syntrop.interfaces.router import (
        Candidate,
        ModelsResult,
        Provider,
        RouteMessage,
        StatusResult,
    )

T = TypeVar("T")

MIB = 1024 * 1024


async def _call(method: "Callable[[Router1Client], Awaitable[T]]", *,
                timeout: float | None = None) -> T:
    """`method(router)` on a new connection to routerd."""
    from syntrop.interfaces.router import Router1
    from syntrop.varlink.client import DEFAULT_TIMEOUT, connect

    async with await connect(Router1, timeout=timeout or DEFAULT_TIMEOUT) as router:
        return await method(router)


def _uptime(usec: int) -> str:
    minutes = usec // 60_000_000
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {usec // 1_000_000 % 60}s"


def format_status(status: "StatusResult", varlink: str,
                  healthy: list[str] | None = None) -> str:
    some = status["memory_some"]
    names = f" ({', '.join(healthy)})" if healthy else ""
    failed = status["ingress_failed"]
    fleet = status["fleet"]
    state = "DEGRADED" if failed or not status["ingress"] or fleet == "degraded" \
        else "OPERATIONAL"
    return "\n".join([
        "● routerd.service - Intelligent Model Router and Wire Protocol Gateway",
        f"Status: {state} (Uptime: {_uptime(status['uptime_usec'])})",
        f"Wire Ingress: {', '.join(status['ingress']) or 'none'}",
        *([f"Ingress Failed: {'; '.join(failed)}"] if failed else []),
        *([f"Fleet: {fleet} ({', '.join(status['fleet_members']) or 'no other node'})"]
          if fleet != "off" else []),
        f"Varlink IPC: {varlink}",
        f"Memory RSS: {status['rss_bytes'] / MIB:.2f} MiB (MemoryHigh: 24M, MemoryMax: 32M)",
        f"Kernel PSI: Memory {some:.1f}% some ({'high' if some > 25 else 'normal'})",
        f"Providers: {status['providers_total']} configured, "
        f"{status['providers_healthy']} healthy{names}",
        f"Total Reqs: {status['requests_total']} served "
        f"({status['routing_errors']} routing errors)",
    ])


def format_providers(providers: "list[Provider]") -> str:
    rows = [("PROVIDER ID", "KIND", "TIER", "STATUS", "WEIGHT", "LATENCY", "MODELS")]
    for p in providers:
        latency = "-" if p.latency_ms is None else f"{p.latency_ms:.1f}ms"
        rows.append((p.id, p.kind, p.tier, p.status.upper(), f"{p.weight:.1f}", latency,
                     ", ".join(p.models)))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    return "\n".join(" ".join(cell.ljust(w) for cell, w in zip(row[:6], widths, strict=True))
                     + " " + row[6] for row in rows)


def format_models(models: "ModelsResult") -> str:
    lines = ["Connected Model", *models["models"],
             "Only connected provider models are listed. Routing aliases",
             f"({', '.join(models['aliases'])})",
             "stay valid request targets and still appear in route and /v1/models."]
    if models["default_model"]:
        lines.append(f"default → {models['default_model']}")
    return "\n".join(lines)


def format_route(candidates: "list[Candidate]", explain: bool) -> str:
    if not explain:
        best = candidates[0]
        return f"{best.provider} / {best.model}"
    lines = ["ROUTING DECISION CANDIDATES:"]
    for index, c in enumerate(candidates, 1):
        lines.append(f"{index}. {c.provider} / {c.model} [SCORE: {c.score:.1f}] "
                     f"Speed: {c.speed:.1f} Cost: {c.cost:.1f} Cap: {c.capability:.1f}"
                     + (" (Selected)" if c.selected else "")
                     + (" (Cooling)" if c.cooling else "")
                     + (" (Throttled: local under pressure)" if c.throttled else "")
                     + (f" (Prefix resident: {c.prefix_chars} chars)" if c.prefix_chars else "")
                     + (" (KV cache full)" if c.cache_full else ""))
    return "\n".join(lines)


def _messages(source: str) -> "list[RouteMessage]":
    """The messages of a chat request's JSON (or a list of messages) in
    `source`, a file or - for stdin; exits with a message when they are
    not that."""
    import json

    from syntrop.interfaces.router import RouteMessage

    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        data = json.loads(text)
        listed = data["messages"] if isinstance(data, dict) else data
        return [RouteMessage(role=str(m["role"]), content=str(m["content"])) for m in listed]
    except OSError as error:
        sys.exit(f"routerctl: {source}: {error.strerror}")
    except (ValueError, KeyError, TypeError):
        sys.exit(f"routerctl: {source}: not a chat request nor a list of messages "
                 "with role and content")


def main(argv: list[str] | None = None) -> None:
    from syntrop.cli.launcher import use_dev_suite

    use_dev_suite()  # the dev suite of `make run`, as syn finds it
    top = argparse.ArgumentParser(prog="routerctl", description="Operate routerd.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("status", help="routerd's status")
    commands.add_parser("providers", help="configured providers")
    test = commands.add_parser("test", help="probe a provider now")
    test.add_argument("provider")
    commands.add_parser("models", help="reachable models")
    route = commands.add_parser("route", help="how a request would be routed")
    route.add_argument("model")
    route.add_argument("--explain", action="store_true", help="print every candidate")
    route.add_argument("--prompt-tokens", type=int, default=None)
    route.add_argument("--messages", metavar="FILE", default=None,
                       help="a chat request's JSON (its messages) or a JSON list of "
                            "messages, for prefix affinity; - for stdin")
    commands.add_parser("reload", help="re-read the configuration")
    args = top.parse_args(argv)
    from asyncvarlink import VarlinkErrorReply

    from syntrop.config import paths
    from syntrop.interfaces.router import NAME

    try:
        if args.command == "status":
            status = asyncio.run(_call(lambda router: router.GetStatus()))
            providers = asyncio.run(_call(lambda router: router.ListProviders()))["providers"]
            print(format_status(status, str(paths().socket(NAME)),
                                [p.id for p in providers if p.status != "cooling"]))
        elif args.command == "providers":
            listed = asyncio.run(_call(lambda router: router.ListProviders()))
            print(format_providers(listed["providers"]))
        elif args.command == "test":
            print(f"[TEST] Probing provider '{args.provider}'...")
            # A real probe: runtimed may load the model first.
            result = asyncio.run(_call(lambda router: router.TestProvider(provider=args.provider),
                                       timeout=90.0))
            mark = "OK" if result["ok"] else "FAIL"
            print(f"[{mark}] {result['detail']} in {result['latency_ms']:.1f}ms.")
            if not result["ok"]:
                sys.exit(1)
        elif args.command == "models":
            print(format_models(asyncio.run(_call(lambda router: router.ListModels()))))
        elif args.command == "route":
            messages = None if args.messages is None else _messages(args.messages)
            candidates = asyncio.run(_call(lambda router: router.Route(
                model=args.model, prompt_tokens=args.prompt_tokens, messages=messages
            )))["candidates"]
            print(format_route(candidates, args.explain))
        else:
            asyncio.run(_call(lambda router: router.Reload()))
            print("routerd reloaded its configuration.")
    except VarlinkErrorReply as error:
        detail = ", ".join(f"{k}: {v}" for k, v in error.paramstojson().items())
        print(f"routerctl: routerd answered {error.name}" + (f" ({detail})" if detail else ""),
              file=sys.stderr)
        sys.exit(1)
    except OSError as error:
        print(f"routerctl: cannot reach routerd: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
