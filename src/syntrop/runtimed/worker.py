"""An engine worker: one model's llama.cpp, in a process of its own.

runtimed starts one worker per resident model (workers.py), the way a
model server keeps its engine apart from its API: llama.cpp is native code
run on files from outside, and a fault in it (SIGSEGV, SIGABRT, an OOM
kill) must end only this model's work, never runtimed's Varlink face or
the other models. The worker

- dies with runtimed (PR_SET_PDEATHSIG), and stays in runtimed's cgroup;
- loads the CPU backend runtimed chose for this host (cpu.py) before
  anything else touches llama.cpp;
- reads requests from its socket (channel.py) and runs each on a thread
  of its own against its Host (host.py): the replies of a stream are
  `piece` and `think` events (text, tokens and, when asked for, their
  logprob entries), then `done` with the result, or
  `error` with a declared Runtime1 error (name and parameters) or, for
  anything undeclared, a message; `cancel` sets a stream's stop event.

Environment (set by runtimed): SYNTROP_WORKER_FD, the worker's end of the
socketpair; SYNTROP_WORKER, its settings (JSON: model, parent pid, layout,
slots, threads, the pace board's descriptor and cell); SYNTROP_ENGINE, the
CPU choice (cpu.Choice as JSON).
"""

import ctypes
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("syntrop.runtimed.worker")

PR_SET_PDEATHSIG = 1
#: Exit status of a worker that could not start its engine.
EXIT_ENGINE = 3
#: Most calls a worker runs at once (runtimed's slots and queue keep far
#: fewer streams in flight; the rest are short calls).
THREADS = 64


class WireSink:
    """A stream's pieces, sent to runtimed as they come."""

    def __init__(self, send: Callable[[dict[str, Any]], None], rid: int,
                 stop: threading.Event, received: float) -> None:
        self._send = send
        self.rid = rid
        self.stop = stop
        self.received = received
        self.started = time.monotonic()

        #: When the first token was sampled: sent with the next message.
        self._first: dict[str, float] | None = None

    def _piece(self, event: str, text: str, tokens: int,
               logprobs: list[dict[str, Any]] | None) -> None:
        message: dict[str, Any] = {"id": self.rid, "event": event, "text": text,
                                   "tokens": tokens}
        if logprobs is not None:
            message["logprobs"] = logprobs
        if self._first is not None:
            message["first"], self._first = self._first, None
        self._send(message)

    def emit(self, text: str, tokens: int,
             logprobs: list[dict[str, Any]] | None = None) -> None:
        self._piece("piece", text, tokens, logprobs)

    def think(self, text: str, tokens: int,
              logprobs: list[dict[str, Any]] | None = None) -> None:
        self._piece("think", text, tokens, logprobs)

    def first(self) -> None:
        # Times for runtimed's trace, carried by the first piece rather than
        # a message of their own (one wake-up less before the first reply).
        self._first = {"received": self.received, "started": self.started,
                       "at": time.monotonic()}

    def times(self) -> dict[str, float] | None:
        """First-token times not sent yet (a stream that emitted nothing)."""
        first, self._first = self._first, None
        return first


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # runtimed died before the prctl
        os._exit(1)


def main() -> None:
    settings = json.loads(os.environ["SYNTROP_WORKER"])
    _die_with_parent(int(settings["parent"]))
    os.nice(int(settings.get("nice", 0)))  # residency.OTHERS_NICE: below triage
    from syntrop.system import logging as syslog

    syslog.setup(f"runtimed[{settings['model']}]")
    from syntrop.runtimed.channel import Endpoint

    endpoint = Endpoint(socket.socket(fileno=int(os.environ["SYNTROP_WORKER_FD"])))
    from syntrop.runtimed import cpu

    choice = cpu.Choice.from_json(os.environ["SYNTROP_ENGINE"])
    try:
        cpu.ready(choice)
    except (OSError, ImportError) as error:
        logger.error("cannot start the engine: %s", error)
        endpoint.send({"id": 0, "event": "fatal", "message": f"cannot start the engine: {error}"})
        os._exit(EXIT_ENGINE)
    from syntrop.runtimed.host import Host
    from syntrop.runtimed.layout import Board, Pace

    board = Board(int(settings["board"]), int(settings["cell"]))
    pace = Pace(settings["layout"], int(settings["cpus"]), int(settings["instances"]), board)
    host = Host(pace, layout=settings["layout"], slots=int(settings["slots"]),
                n_threads=int(settings["cpus"]))
    Worker(endpoint, host, choice).serve()
    # Every context dies with the process; llama.cpp's destructors at
    # interpreter exit would only add a way to crash.
    os._exit(0)


class Worker:
    """Requests in, replies out; one thread per request."""

    def __init__(self, endpoint: Any, host: Any, choice: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.endpoint = endpoint
        self.host = host
        self.choice = choice
        self.running: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        # Threads kept for the next request (starting one costs more than
        # the hop from runtimed); runtimed's slots bound how many run.
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="call")

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        try:
            self.endpoint.send(message, fds or ())
        except OSError:  # runtimed is gone: so are we
            os._exit(0)

    def serve(self) -> None:
        while True:
            received = self.endpoint.receive()
            if received is None:
                return
            message, fds = received
            rid, op = int(message.get("id", 0)), str(message.get("op", ""))
            if op == "cancel":
                with self._lock:
                    stop = self.running.get(rid)
                if stop is not None:
                    stop.set()
                continue
            if op == "exit":
                return
            stop = threading.Event()
            with self._lock:
                self.running[rid] = stop
            self._pool.submit(self.handle, rid, op, message.get("args") or {}, fds, stop,
                              time.monotonic())

    def handle(self, rid: int, op: str, args: dict[str, Any], fds: list[int],
               stop: threading.Event, received: float) -> None:
        from asyncvarlink import VarlinkErrorReply

        from syntrop.runtimed.host import check_constraint

        sink = WireSink(self.send, rid, stop, received)
        try:
            result, out = self.dispatch(op, args, fds, sink)
        except VarlinkErrorReply as error:
            self.send({"id": rid, "event": "error",
                       "error": {"name": error.name, "parameters": error.paramstojson()}})
        except Exception as error:
            declared = check_constraint(error)
            if declared is not None:
                self.send({"id": rid, "event": "error",
                           "error": {"name": declared.name,
                                     "parameters": declared.paramstojson()}})
            else:
                logger.exception("%s failed", op)
                self.send({"id": rid, "event": "error",
                           "error": {"name": None, "message": f"{type(error).__name__}: {error}"}})
        else:
            done: dict[str, Any] = {"id": rid, "event": "done", "result": result}
            if (first := sink.times()) is not None:
                done["first"] = first
            try:
                self.send(done, out)
            finally:
                for fd in out:
                    os.close(fd)
        finally:
            with self._lock:
                self.running.pop(rid, None)

    def dispatch(self, op: str, args: dict[str, Any], fds: list[int],
                 sink: WireSink) -> tuple[dict[str, Any], list[int]]:
        host = self.host
        if op == "hello":
            import llama_cpp

            for fd in fds:
                os.close(fd)
            return {"pid": os.getpid(), "engine": self.choice.describe(),
                    "system_info": llama_cpp.llama_print_system_info().decode(
                        errors="replace").strip()}, []
        if op in ("load", "draft"):
            if len(fds) != 1:
                raise ValueError(f"{op}: one descriptor expected")
            load = host.load if op == "load" else host.load_draft
            return load(str(args["name"]), fds[0]), []
        if op == "save":
            result, out = host.save(args)
            return result, out
        if op == "open":
            return host.open(args, fds), []
        if op == "restore":
            return host.restore(args, fds), []
        for fd in fds:
            os.close(fd)
        handlers: dict[str, Callable[[], dict[str, Any]]] = {
            "generate": lambda: host.generate(args, sink),
            "decode": lambda: host.decode(args, sink),
            "embed": lambda: host.embed(args),
            "prefix": lambda: host.prefix(args),
            "suffix": lambda: host.suffix(args),
            "close": lambda: host.close_session(args),
            "trim": lambda: host.trim(),
        }
        if op not in handlers:
            raise ValueError(f"unknown operation {op!r}")
        return handlers[op](), []


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
