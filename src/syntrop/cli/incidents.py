"""`syn incidents [ID]`: what systemd-sentry saw and did.

Without an ID, a table of the newest incidents (--limit, --unit); with one,
that incident in full: each phase with its outcome, duration against its
budget and detail, the cause and its evidence, the findings, the plan step
by step with how each step went, and who planned it. --json prints Sentry1's
answer as it is.
"""

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Sentry1Client

T = TypeVar("T")

#: Seconds a call may take (a manual Triage is not made here: reads only).
TIMEOUT = 30.0


class IncidentsError(Exception):
    """A failure to report in one line."""


def _plain(value: Any) -> Any:
    """Records (dataclasses) and lists as JSON-ready values."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


async def _call(method: "Callable[[Sentry1Client], Awaitable[T]]") -> T:
    """`method(sentry)` on a new connection to systemd-sentry."""
    from asyncvarlink import VarlinkErrorReply

    from syntrop.interfaces.sentry import Sentry1
    from syntrop.varlink.client import address_of, connect

    try:
        client = await connect(Sentry1, timeout=TIMEOUT)
    except OSError as error:
        raise IncidentsError(f"cannot reach systemd-sentry at {address_of(Sentry1)}: "
                             f"{error.strerror or error}") from None
    try:
        async with client:
            return await method(client)
    except VarlinkErrorReply as error:
        name = error.name.rsplit(".", 1)[-1]
        raise IncidentsError(f"systemd-sentry answered {name} "
                             f"{json.dumps(error.paramstojson())}") from None
    except (ConnectionError, EOFError):
        raise IncidentsError("lost the connection to systemd-sentry") from None


def _incidents(limit: int, unit: str | None = None) -> list[dict[str, Any]]:
    """Sentry1.ListIncidents, as JSON-ready dicts."""
    reply = asyncio.run(_call(lambda sentry: sentry.ListIncidents(limit=limit, unit=unit)))
    return [_plain(incident) for incident in reply["incidents"]]


def _when(usec: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(usec / 1e6))


def _ms(usec: int) -> str:
    return f"{usec / 1000:.0f} ms" if usec >= 10_000 else f"{usec / 1000:.1f} ms"


def _step(tool: str, parameters: dict[str, Any]) -> str:
    params = " ".join(f"{k}={v}" for k, v in sorted(parameters.items()) if k != "unit")
    return f"{tool} {params}".strip()


def action(incident: dict[str, Any]) -> str:
    """The plan as `tool k=v → tool ...`, or `-`."""
    plan = incident.get("plan")
    if plan:
        return " → ".join(_step(s["tool"], json.loads(s["parameters"])) for s in plan)
    if not incident.get("decision"):
        return "-"
    decision = json.loads(incident["decision"])
    return _step(decision["tool"], decision.get("parameters", {}))


def elapsed(incident: dict[str, Any]) -> int:
    """From the failure signal to the end of the last phase, microseconds."""
    ends = [p["started_usec"] + p["duration_usec"] for p in incident["phases"]
            if p["outcome"] != "skipped"]
    return int(max(ends, default=incident["detected_usec"]) - incident["detected_usec"])


def _table(incidents: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, title=f"{len(incidents)} incidents")
    for column in ("ID", "DETECTED", "UNIT", "TRIGGER", "CAUSE", "PLAN", "BY", "RESULT", "TOOK"):
        table.add_column(column)
    for incident in reversed(incidents):  # newest first
        cause = incident.get("cause") or {}
        table.add_row(incident["id"][:12], _when(incident["detected_usec"]), incident["unit"],
                      incident["trigger"], cause.get("kind", "-"), action(incident),
                      incident.get("decided_by") or "-", incident["result"],
                      _ms(elapsed(incident)))
    Console().print(table)


def show(incident: dict[str, Any], console: Any = None) -> None:
    """One incident in full (also used by the demo)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"[bold]incident {incident['id']}[/bold]  {incident['unit']}  "
                  f"{incident['trigger']} at {_when(incident['detected_usec'])}")
    table = Table(box=None)
    for column in ("PHASE", "OUTCOME", "TOOK", "BUDGET", "DETAIL"):
        table.add_column(column, overflow="fold")
    for phase in incident["phases"]:
        took = "-" if phase["outcome"] == "skipped" else _ms(phase["duration_usec"])
        table.add_row(phase["name"], phase["outcome"], took, _ms(phase["budget_usec"]),
                      phase["detail"])
    console.print(table)
    cause = incident.get("cause")
    if cause:
        reach = "syntrop's tools can fix it" if cause["fixable"] else \
            "out of the tools' reach: at most one restart, then a human"
        console.print(f"cause: [bold]{cause['kind']}[/bold]: {cause['summary']} ({reach})")
        for line in cause.get("evidence") or []:
            console.print(f"  evidence: {line}")
    for line in incident.get("findings") or []:
        console.print(f"finding: {line}")
    plan = incident.get("plan") or []
    console.print(f"plan (by {incident.get('decided_by') or '-'}): "
                  f"{'nothing' if not plan else ''}")
    for number, step in enumerate(plan, 1):
        message = f" — {step['message']}" if step.get("message") else ""
        console.print(f"  {number}. {_step(step['tool'], json.loads(step['parameters']))}: "
                      f"{step['outcome']}{message}")
    console.print(f"result: [bold]{incident['result']}[/bold] after "
                  f"{_ms(elapsed(incident))}; {incident['summary']}")


def _full_id(given: str) -> str:
    """An id as the table shows it (its first 12 characters) or any unique
    prefix, made whole from the incidents sentry keeps; a full id as is."""
    if len(given) >= 32:
        return given
    listed = _incidents(1000)
    found = sorted({str(i["id"]) for i in listed if str(i["id"]).startswith(given)})
    if not found:
        raise IncidentsError(f"no incident id starts with {given!r} (syn incidents lists them)")
    if len(found) > 1:
        raise IncidentsError(f"{given!r} is the start of {len(found)} incident ids: "
                             f"{', '.join(f[:16] for f in found[:5])}…; give more of it")
    return found[0]


def cmd_incidents(args: argparse.Namespace) -> int:
    if args.id is not None:
        full = _full_id(args.id)
        incident = _plain(asyncio.run(_call(lambda sentry: sentry.GetIncident(id=full)))
                          ["incident"])
        if args.json:
            print(json.dumps(incident))
        else:
            show(incident)
        return 0
    if not 0 <= args.limit <= 1000:
        raise IncidentsError("--limit must be between 0 and 1000")
    listed = _incidents(args.limit, args.unit)
    if args.json:
        print(json.dumps(listed))
    else:
        _table(listed)
    return 0


def _reported(args: argparse.Namespace) -> int:
    try:
        return cmd_incidents(args)
    except IncidentsError as error:
        print(f"syn: {error}", file=sys.stderr)
        return 1


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add `incidents` to syn's subcommands."""
    sub = commands.add_parser("incidents", help="what systemd-sentry saw and did")
    sub.add_argument("id", nargs="?", metavar="ID", help="one incident in full")
    sub.add_argument("--unit", help="only this unit's incidents")
    sub.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    sub.add_argument("--json", action="store_true", help="machine-readable output")
    sub.set_defaults(func=_reported)
