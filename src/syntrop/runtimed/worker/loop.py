"""An engine worker: one model's llama.cpp, in a process of its own.

runtimed starts one worker per resident model (supervisor.py), the way a
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
  `error` with a declared failure (a protocol.Kind and its parameters;
  the face raises the Runtime1 error it stands for) or, for anything
  undeclared, a message; `cancel` sets a stream's stop event.

Messages are protocol.py's. Environment (set by runtimed):
SYNTROP_WORKER_FD, the worker's end of the socketpair; SYNTROP_WORKER, its
settings (protocol.Settings as JSON); SYNTROP_ENGINE, the CPU choice
(cpu.Choice as JSON).
"""

import ctypes
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from syntrop.runtimed import protocol

if TYPE_CHECKING:
    from syntrop.runtimed.worker.host import Host
    from syntrop.runtimed.worker.voice import Voice

logger = logging.getLogger("syntrop.runtimed.worker")

PR_SET_PDEATHSIG = 1
#: Exit status of a worker that could not start its engine.
EXIT_ENGINE = 3
#: Most calls a worker runs at once (runtimed's slots and queue keep far
#: fewer streams in flight; the rest are short calls).
THREADS = 64


class WireSink:
    """A stream's pieces, sent to runtimed as they come."""

    def __init__(self, send: Callable[[protocol.Message], None], rid: int,
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
        first, self._first = self._first, None
        self._send(protocol.Piece(self.rid, event, text, tokens, logprobs, first))

    def emit(self, text: str, tokens: int,
             logprobs: list[dict[str, Any]] | None = None) -> None:
        self._piece("piece", text, tokens, logprobs)

    def think(self, text: str, tokens: int,
              logprobs: list[dict[str, Any]] | None = None) -> None:
        self._piece("think", text, tokens, logprobs)

    def audio(self, packet: bytes, sentence: int) -> None:
        """A speech packet (voice.py), base64, with its sentence's index."""
        from syntrop.runtimed.worker.voice import encode

        self._piece("audio", encode(packet), sentence, None)

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
    settings = protocol.Settings.from_json(os.environ["SYNTROP_WORKER"])
    _die_with_parent(settings.parent)
    os.nice(settings.nice)  # residency.OTHERS_NICE: below triage
    from syntrop.system import logging as syslog

    syslog.setup(f"runtimed[{settings.model}]")
    from syntrop.runtimed.channel import Endpoint

    endpoint = Endpoint(socket.socket(fileno=int(os.environ["SYNTROP_WORKER_FD"])))
    from syntrop.runtimed import cpu

    choice = cpu.Choice.from_json(os.environ["SYNTROP_ENGINE"])
    try:
        cpu.ready(choice)
    except (OSError, ImportError) as error:
        logger.error("cannot start the engine: %s", error)
        endpoint.send(protocol.encode(protocol.Fatal(f"cannot start the engine: {error}")))
        os._exit(EXIT_ENGINE)
    from syntrop.runtimed.layout import Board, Pace
    from syntrop.runtimed.worker.host import Host

    board = Board(settings.board, settings.cell)
    pace = Pace(settings.layout, settings.cpus, settings.instances, board)
    host = Host(pace, layout=settings.layout, slots=settings.slots, n_threads=settings.cpus)
    Loop(endpoint, host, choice).serve()
    # Every context dies with the process; llama.cpp's destructors at
    # interpreter exit would only add a way to crash.
    os._exit(0)


class Loop:
    """Requests in, replies out; one thread per request."""

    def __init__(self, endpoint: Any, host: "Host", choice: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.endpoint = endpoint
        self.host = host
        self.choice = choice
        self.running: dict[int, threading.Event] = {}
        #: The voice this worker hosts instead of a GGUF model (voice.py).
        self.voice: Voice | None = None
        self._lock = threading.Lock()
        # Threads kept for the next request (starting one costs more than
        # the hop from runtimed); runtimed's slots bound how many run.
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="call")

    def send(self, message: protocol.Message, fds: list[int] | None = None) -> None:
        try:
            self.endpoint.send(protocol.encode(message), fds or ())
        except OSError:  # runtimed is gone: so are we
            os._exit(0)

    def serve(self) -> None:
        while True:
            received = self.endpoint.receive()
            if received is None:
                return
            wire, fds = received
            try:
                message = protocol.decode(wire)
            except (ValueError, TypeError, KeyError) as error:  # no operation this worker knows
                for fd in fds:
                    os.close(fd)
                self.send(protocol.Failed(int(wire.get("id", 0)), None,
                                          message=f"not a request: {error!r}"))
                continue
            if isinstance(message, protocol.Cancel):
                with self._lock:
                    stop = self.running.get(message.id)
                if stop is not None:
                    stop.set()
                continue
            if isinstance(message, protocol.Exit):
                return
            if not isinstance(message, protocol.Request):
                raise ValueError(f"not a request: {message!r}")
            stop = threading.Event()
            with self._lock:
                self.running[message.id] = stop
            self._pool.submit(self.handle, message, fds, stop, time.monotonic())

    def handle(self, request: protocol.Request, fds: list[int],
               stop: threading.Event, received: float) -> None:
        rid = request.id
        sink = WireSink(self.send, rid, stop, received)
        try:
            result, out = self.dispatch(request.operation, fds, sink)
        except Exception as error:
            declared = worker_error(error)
            if declared is not None:
                self.send(protocol.Failed(rid, declared.kind, declared.parameters))
            else:
                logger.exception("%s failed", request.op)
                self.send(protocol.Failed(rid, None,
                                          message=f"{type(error).__name__}: {error}"))
        else:
            try:
                self.send(protocol.Done(rid, result, sink.times()), out)
            finally:
                for fd in out:
                    os.close(fd)
        finally:
            with self._lock:
                self.running.pop(rid, None)

    def dispatch(self, operation: protocol.Operation, fds: list[int],
                 sink: WireSink) -> tuple[dict[str, Any], list[int]]:
        if isinstance(operation, protocol.Speak | protocol.Load) or self.voice is not None:
            spoken = self._voice(operation, fds, sink)
            if spoken is not None:
                return spoken, []
        match operation:
            case protocol.Load() | protocol.Draft() if len(fds) != 1:
                raise ValueError(f"{type(operation).__name__}: one descriptor expected")
            case protocol.Load(name=name, placement=placed):
                return self.host.load(name, fds[0], placed), []
            case protocol.Draft(name=name):
                return self.host.load_draft(name, fds[0]), []
            case protocol.Save():
                result, out = self.host.save(operation)
                return result, out
            case protocol.Open():
                return self.host.open(operation, fds), []
            case protocol.Restore():
                return self.host.restore(operation, fds), []
            case protocol.Generate():
                return self.host.generate(operation, sink, fds), []
        for fd in fds:
            os.close(fd)
        if isinstance(operation, protocol.Export):
            from syntrop.runtimed.worker import handoff

            host = self.host
            result, out = handoff.export(host._pool(), operation.options, operation.messages,
                                         host.slots, sink.stop, host.pace, operation.digest)
            return dict(result), out
        return self._engine(operation, sink), []

    def _engine(self, operation: protocol.Operation, sink: WireSink) -> dict[str, Any]:
        """The operations that take no descriptor."""
        host = self.host
        match operation:
            case protocol.Hello():
                import llama_cpp

                return {"pid": os.getpid(), "engine": self.choice.describe(),
                        "system_info": llama_cpp.llama_print_system_info().decode(
                            errors="replace").strip()}
            case protocol.Decode():
                return host.decode(operation, sink)
            case protocol.Embed():
                return host.embed(operation)
            case protocol.Prefix():
                return host.prefix(operation)
            case protocol.Suffix():
                return host.suffix(operation)
            case protocol.Close():
                return host.close_session(operation)
            case protocol.Trim():
                return host.trim()
        raise ValueError(f"not an operation of a model: {operation!r}")

    def _voice(self, operation: protocol.Operation, fds: list[int],
               sink: WireSink) -> dict[str, Any] | None:
        """The operations of a worker that hosts a voice (None: not a
        voice's operation, or a load of a GGUF model)."""
        from syntrop.runtimed.worker import voice

        if isinstance(operation, protocol.Load):
            if len(fds) != 1 or not voice.is_voice(fds[0]):
                return None
            self.voice = voice.Voice(operation.name, fds[0], operation.digest)
            return {"voice": True, "sample_rate": self.voice.rate}
        for fd in fds:
            os.close(fd)
        if isinstance(operation, protocol.Speak):
            if self.voice is None:
                raise protocol.WorkerError(protocol.Kind.NOT_A_VOICE, model=operation.model)
            return self.voice.speak(operation, sink)
        if isinstance(operation, protocol.Trim):
            return {"closed": 0}
        raise protocol.WorkerError(protocol.Kind.INVALID_MODEL,
                                   model=self.voice.name if self.voice else "",
                                   reason="a voice: only Speak runs it")


def worker_error(error: Exception) -> protocol.WorkerError | None:
    """The declared failure `error` is (a constraint that failed while
    decoding is one), or None."""
    from syntrop.runtimed.constrain import ConstraintError

    if isinstance(error, ConstraintError):
        return protocol.WorkerError(protocol.Kind.CONSTRAINT, reason=error.reason,
                                    message=error.message[:512])
    return error if isinstance(error, protocol.WorkerError) else None
