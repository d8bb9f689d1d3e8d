"""syn: the user's command for the suite.

    syn up [--dir DIR]      run the seven daemons socket-activated (dev mode)
    syn status [--dir DIR]  which daemons run, their sockets, their last exit
    syn down [--dir DIR]    stop them

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

from syntrop.cli.launcher import DAEMONS, default_directory


class CliError(Exception):
    """A failure to report in one line, without a traceback."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _launcher_pid(directory: Path) -> int | None:
    try:
        pid = int((directory / "launcher.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def cmd_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    if (pid := _launcher_pid(directory)) is not None:
        print(f"syntrop is already up in {directory} (launcher pid {pid})")
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "syntrop.cli.launcher", str(directory), str(args.idle_timeout)]
    if args.foreground:
        os.execv(sys.executable, argv)
    log = open(directory / "launcher.log", "ab")  # noqa: SIM115 - handed to the child
    with log:
        subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    deadline = time.monotonic() + 10
    while _launcher_pid(directory) is None:
        if time.monotonic() > deadline:
            raise CliError(f"the launcher did not start; see {directory / 'launcher.log'}")
        time.sleep(0.02)
    run = directory / "run"
    print(f"syntrop is up in {directory}: sockets in {run}, started on first connection.")
    print(f"  export RUNTIME_DIRECTORY={run}")
    print(f"  varlinkctl info unix:{run}/io.syntrop.Inference1")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    pid = _launcher_pid(directory)
    try:
        states = json.loads((directory / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        states = {}
    rows = []
    for daemon in DAEMONS:
        path = directory / "run" / daemon.interface
        state = states.get(daemon.program, {})
        # Like systemctl status, this asks the launcher, not the daemons: a
        # call would start an idle daemon, or keep a running one from idling.
        running = pid is not None and bool(state.get("pid"))
        rows.append(
            {
                "daemon": daemon.program,
                "interface": daemon.interface,
                "socket": str(path),
                "state": "running" if running else "listening" if pid is not None else "down",
                "pid": state.get("pid"),
                "starts": state.get("starts", 0),
                "last_exit": state.get("last_exit"),
            }
        )
    if args.json:
        print(json.dumps({"directory": str(directory), "launcher_pid": pid, "daemons": rows}))
        return 0 if pid is not None else 3
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"syntrop in {directory}" + ("" if pid else " (down)"), box=None)
    for column in ("DAEMON", "STATE", "PID", "STARTS", "LAST EXIT", "SOCKET"):
        table.add_column(column)
    for row in rows:
        last_exit = row["last_exit"]
        table.add_row(
            row["daemon"], row["state"], str(row["pid"] or "-"), str(row["starts"]),
            "-" if last_exit is None else str(last_exit), row["socket"],
        )
    Console().print(table)
    # Like systemctl status: 3 when not running.
    return 0 if pid is not None else 3


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    pid = _launcher_pid(directory)
    if pid is None:
        print(f"syntrop is not up in {directory}")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            raise CliError(f"launcher pid {pid} did not stop within 10 s")
        time.sleep(0.02)
    print(f"syntrop is down in {directory}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="syn", description="Control the syntrop suite.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_dir(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--dir", type=Path, default=default_directory(),
            help="launcher directory (default: $SYNTROP_DEV_DIR or ~/.local/state/syntrop/dev)",
        )
        return sub

    up = with_dir(commands.add_parser("up", help="start the suite in dev mode"))
    up.add_argument("--foreground", action="store_true", help="do not detach")
    up.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="daemons exit after this long without clients (default 30)")
    up.set_defaults(func=cmd_up)
    status = with_dir(commands.add_parser("status", help="show the daemons"))
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    with_dir(commands.add_parser("down", help="stop the suite")).set_defaults(func=cmd_down)
    from syntrop.cli import models

    models.register(commands)  # pull, list, show, rm, pin, unpin, prune
    from syntrop.cli import run

    run.register(commands)  # run, ps
    from syntrop.cli import incidents

    incidents.register(commands)  # incidents
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        sys.exit(args.func(args))
    except CliError as error:
        print(f"syn: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
