"""syn: the user's command for the suite.

    syn up [--dir DIR]      run the seven daemons socket-activated (dev mode)
    syn status [--dir DIR]  which daemons run, their sockets, their last exit
    syn down [--dir DIR]    stop them
    syn logs [DAEMON] [-n N] [--dir DIR]  the dev daemons' logs, merged by time

Later commands (pull, list, rm, pin, prune, run, ps, incidents, audit) join
here as their daemons gain the methods behind them.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syntrop.cli.launcher import (
    DAEMONS,
    LISTEN,
    default_directory,
    launcher_pid,
    locate,
    pid_alive,
    use_dev_suite,
)

if TYPE_CHECKING:
    from syntrop.packaged import Packaged


class CliError(Exception):
    """A failure to report in one line, without a traceback."""


def cmd_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    if (pid := launcher_pid(directory)) is not None:
        print(f"syntrop is already up in {directory} (launcher pid {pid})")
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "syntrop.cli.launcher", str(directory), str(args.idle_timeout)]
    env = dict(os.environ)
    if args.listen:
        env[LISTEN] = ",".join(args.listen)
    if args.foreground:
        os.execve(sys.executable, argv, env)
    log = open(directory / "launcher.log", "ab")  # noqa: SIM115 - handed to the child
    with log:
        launcher = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env=env)
    deadline = time.monotonic() + 10
    while launcher_pid(directory) is None:
        if launcher.poll() is not None or time.monotonic() > deadline:
            lines = (directory / "launcher.log").read_text(errors="replace").splitlines()
            why = f": {lines[-1].split(': ', 2)[-1]}" if lines else ""
            raise CliError(f"the launcher did not start{why} "
                           f"(see {directory / 'launcher.log'})")
        time.sleep(0.02)
    run = directory / "run"
    print(f"syntrop is up in {directory}: sockets in {run}, started on first connection.")
    states = _states(directory)
    router = states.get("routerd", {})
    for address in router.get("http", []):
        if not address.startswith("unix:"):
            print(f"  OpenAI API: http://{address}/v1")
    if failed := router.get("http_failed", []):
        # A suite whose OpenAI endpoint is not there is not up: say which
        # address, how to choose another, and leave nothing running.
        for problem in failed:
            print(f"syn: routerd's HTTP ingress cannot listen on {problem}", file=sys.stderr)
        print(f"syn: choose another address with `syn up --listen HOST:PORT` (or {LISTEN}=); "
              "the suite is stopped", file=sys.stderr)
        launcher.terminate()
        launcher.wait(timeout=10)
        print(f"syntrop is down in {directory}")
        return 1
    if not args.no_model:
        _default_model(run)
    print(f"  export RUNTIME_DIRECTORY={run}   # for varlinkctl; syn finds it by itself")
    return 0


def _default_model(run: Path) -> None:
    """Register the default models in modeld, pinned (syntrop.packaged:
    SmolLM2, and Qwen2.5-Coder-0.5B, sentry's triage model), and the voices
    (joe, for Runtime1.Speak and routerd's /v1/audio/speech), each unless
    modeld already has a model of that name or its packages are not
    installed. A failure is reported, not fatal: the suite is up either way."""
    import asyncio

    from syntrop import packaged

    for model in (*packaged.DEFAULTS, *packaged.VOICES):
        kind = "voice" if model in packaged.VOICES else "default model"
        if not packaged.installed(model):
            print(f"  no {model.name}: its packages ({model.packages[0]}, …) are not installed")
            continue
        try:
            print(f"  {kind}: {asyncio.run(_register(run, model))}")
        except Exception as error:  # the suite is up; say why the model is not
            print(f"syn: the {kind} {model.name} was not registered: {error}",
                  file=sys.stderr)


async def _register(run: Path, model: "Packaged") -> str:
    from asyncvarlink import FileDescriptor

    from syntrop import packaged
    from syntrop.interfaces.model import Model1, ModelNotFound
    from syntrop.varlink.client import connect

    async with await connect(Model1, address=run / Model1.name, timeout=120) as modeld:
        try:
            shown = (await modeld.Show(name=model.name))["model"]
            return f"{model.name} (already in modeld{', pinned' if shown.pinned else ''})"
        except ModelNotFound:
            pass
        path = packaged.locate(model)
        assert path is not None  # installed: checked by the caller
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            await modeld.Register(name=model.name, fd=FileDescriptor(fd), sha256=model.sha256,
                                  pin=True, source=str(path))
        finally:
            os.close(fd)
        return f"{model.name} (registered in modeld and pinned, from {path.name})"


def _states(directory: Path) -> dict[str, Any]:
    try:
        states: dict[str, Any] = json.loads((directory / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return states


def exit_words(code: int | None) -> str:
    """A wait status as os.waitstatus_to_exitcode gives it, in words."""
    if code is None:
        return "-"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def _failed(code: int | None) -> bool:
    """Whether a daemon's last exit was a failure (idle exits are 0; syn
    down stops daemons with SIGTERM, as systemd does)."""
    return code not in (None, 0, -signal.SIGTERM)


def _engine(directory: Path) -> dict[str, Any] | None:
    """runtimed's engine and workers (Runtime1.GetEngine), asked only while
    runtimed runs: a call would start an idle one."""
    import asyncio

    from syntrop.interfaces.runtime import Runtime1
    from syntrop.varlink.client import connect

    async def ask() -> dict[str, Any]:
        address = directory / "run" / Runtime1.name
        async with await connect(Runtime1, address=address, timeout=5) as runtime:
            engine = await runtime.GetEngine()
        workers = [{"model": w.model, "state": w.state, "pid": w.pid, "crashes": w.crashes,
                    "last_exit": w.last_exit, "last_signal": w.last_signal,
                    "retry_after_s": w.retry_after_s} for w in engine["workers"]]
        return {"cpu": engine["cpu"], "build": engine["build"], "variant": engine["variant"],
                "amx": engine["amx"], "workers": workers}

    try:
        return asyncio.run(ask())
    except Exception:  # runtimed went idle meanwhile, or is older: nothing to show
        return None


def cmd_status(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    pid = launcher_pid(directory)
    states = _states(directory)
    rows = []
    for daemon in DAEMONS:
        path = directory / "run" / daemon.interface
        state = states.get(daemon.program, {})
        # Like systemctl status, this asks the launcher, not the daemons: a
        # call would start an idle daemon, or keep a running one from idling.
        running = pid is not None and bool(state.get("pid"))
        last_exit = state.get("last_exit")
        rows.append(
            {
                "daemon": daemon.program,
                "interface": daemon.interface,
                "socket": str(path),
                "state": "running" if running else "down" if pid is None
                else "failed" if _failed(last_exit) else "listening",
                "pid": state.get("pid"),
                "starts": state.get("starts", 0),
                "last_exit": last_exit,
            }
        )
    runtimed = next(row for row in rows if row["daemon"] == "runtimed")
    engine = _engine(directory) if runtimed["state"] == "running" else None
    if args.json:
        print(json.dumps({"directory": str(directory), "launcher_pid": pid, "daemons": rows,
                          "engine": engine}))
        return 0 if pid is not None else 3
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"syntrop in {directory}" + ("" if pid else " (down)"), box=None)
    for column in ("DAEMON", "STATE", "PID", "STARTS", "LAST EXIT"):
        table.add_column(column, no_wrap=True)
    table.add_column("SOCKET", overflow="fold")  # the long one gives way
    for row in rows:
        table.add_row(
            row["daemon"], row["state"], str(row["pid"] or "-"), str(row["starts"]),
            exit_words(row["last_exit"]), row["socket"],
        )
    console.print(table)
    if engine is not None:
        where = f"CPU backend {engine['variant']}" if engine["variant"] else "built-in CPU backend"
        workers = Table(title=f"runtimed's engine: {where} on {engine['cpu']}", box=None)
        for column in ("MODEL", "STATE", "PID", "CRASHES", "LAST EXIT"):
            workers.add_column(column)
        for worker in engine["workers"]:
            state = "running" if worker["state"] == "running" else f"failed ({worker['state']})"
            workers.add_row(worker["model"], state, str(worker["pid"] or "-"),
                            str(worker["crashes"]), worker["last_exit"] or "-")
        console.print(workers)
    # Like systemctl status: 3 when not running.
    return 0 if pid is not None else 3


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    pid = launcher_pid(directory)
    if pid is None:
        print(f"syntrop is not up in {directory}")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise CliError(f"launcher pid {pid} did not stop within 10 s")
        time.sleep(0.02)
    print(f"syntrop is down in {directory}")
    return 0


def _entries(path: Path) -> list[str]:
    """A log file as entries: a stamped line with the unstamped lines after
    it (a traceback stays with its message)."""
    entries: list[str] = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return entries
    for line in text.splitlines():
        if entries and not line[:4].isdigit():
            entries[-1] += "\n" + line
        else:
            entries.append(line)
    return entries


def cmd_logs(args: argparse.Namespace) -> int:
    logs: Path = args.dir.resolve() / "log"
    names = [d.program for d in DAEMONS]
    if args.daemon is not None and args.daemon not in names:
        raise CliError(f"no daemon {args.daemon!r}: one of {', '.join(names)}")
    chosen = [args.daemon] if args.daemon else names
    if not logs.is_dir():
        raise CliError(f"no logs in {logs}: syn up starts the suite there")
    entries = [entry for name in chosen for entry in _entries(logs / f"{name}.log")[-args.lines:]]
    entries.sort(key=lambda entry: entry[:23] if entry[:4].isdigit() else "")
    for entry in entries[-args.lines:]:
        print(entry)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("syntrop")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="syn", description="Control the syntrop suite.")
    top.add_argument("--version", action="version", version=f"syn {_version()}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_dir(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--dir", type=Path, default=None,
            help="launcher directory (default: the one $RUNTIME_DIRECTORY is in, else "
                 "$SYNTROP_DEV_DIR or ~/.local/state/syntrop/dev)",
        )
        return sub

    up = with_dir(commands.add_parser("up", help="start the suite in dev mode"))
    up.add_argument("--foreground", action="store_true", help="do not detach")
    up.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="daemons exit after this long without clients (default 30)")
    up.add_argument("--listen", action="append", metavar="HOST:PORT",
                    help="routerd's HTTP ingress here instead of routerd.toml's http.listen "
                         f"(repeatable; also ${LISTEN}, comma-separated)")
    up.add_argument("--no-model", action="store_true",
                    help="do not register the default models (SmolLM2, "
                         "Qwen2.5-Coder-0.5B) and the voice joe in modeld")
    up.set_defaults(func=cmd_up)
    status = with_dir(commands.add_parser("status", help="show the daemons"))
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    with_dir(commands.add_parser("down", help="stop the suite")).set_defaults(func=cmd_down)
    logs = with_dir(commands.add_parser("logs", help="the dev daemons' logs, merged by time"))
    logs.add_argument("daemon", nargs="?", metavar="DAEMON", help="only this daemon's")
    logs.add_argument("-n", "--lines", type=int, default=50, help="the last N entries (50)")
    logs.set_defaults(func=cmd_logs)
    from syntrop.cli import models

    models.register(commands)  # pull, list, show, rm, pin, unpin, prune
    from syntrop.cli import run

    run.register(commands)  # run, ps
    from syntrop.cli import incidents

    incidents.register(commands)  # incidents
    from syntrop.cli import say

    say.register(commands)  # say
    return top


def _find_suite(args: argparse.Namespace) -> None:
    """One rule for every subcommand (launcher.locate): the dev commands get
    their directory, the others their sockets through $RUNTIME_DIRECTORY."""
    if hasattr(args, "dir"):
        args.dir = locate(args.dir) or default_directory()
    else:
        use_dev_suite()


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    _find_suite(args)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that left is seen here, not at exit
        sys.exit(code)
    except CliError as error:
        print(f"syn: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # `syn status --json | head`: the reader left. Say nothing; point
        # stdout at /dev/null so the interpreter's final flush is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)


if __name__ == "__main__":
    main()
