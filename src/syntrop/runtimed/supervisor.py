"""runtimed's side of its engine workers: starting one, calling it, and
noticing at once when it dies.

`WorkerProcess.start` runs `python -m syntrop.runtimed.worker` with one end
of a socketpair and waits for its hello. Calls are messages on that socket
(protocol.py, carried by channel.py): `request` waits for one reply; `open`
sends a call whose replies (a stream's pieces) its reader takes from
`Call.events` as they come. A call is finished when the worker says so (done or error) or when
the worker is gone.

Death is watched through a pidfd on the event loop: when the process ends,
every call in flight on it fails at once with `WorkerGone` (its exit status
or signal, and what it was serving), the `on_exit` callback runs, and the
WorkerProcess is done for; the next request makes a new one (residency.py decides
whether, and when). A worker that closes its socket without exiting is
killed after a second.

Workers are started from the event loop's thread on purpose: the
parent-death signal a worker sets (PR_SET_PDEATHSIG) fires when the
*thread* that forked it ends, and the loop's thread lives as long as
runtimed does.
"""

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from syntrop.interfaces import runtime
from syntrop.runtimed import channel, protocol
from syntrop.varlink import InvalidParameter

logger = logging.getLogger(__name__)

#: Seconds a new worker has to start its engine and say hello.
START_TIMEOUT = 60.0
#: Seconds a worker asked to exit has before it is killed.
STOP_TIMEOUT = 5.0
#: Seconds a worker whose socket closed may live on before it is killed.
LINGER = 1.0


@dataclass(frozen=True, slots=True)
class Exit:
    """How a worker ended: its wait status, as subprocess reports it."""

    returncode: int

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    @property
    def signal_name(self) -> str | None:
        number = self.signal
        if number is None:
            return None
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal} ({self.signal_name})"
        return f"exited with status {self.returncode}"


class WorkerGone(Exception):
    """The worker died (or could not start) while a call was on it."""

    def __init__(self, model: str, exit: Exit | None, reason: str) -> None:
        super().__init__(f"the engine for {model} {reason}")
        self.model = model
        self.exit = exit
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Gone:
    """Put in a call's events when its worker died with the call on it."""


#: The Runtime1 error each kind of a worker's declared failure raises to
#: the caller, with the failure's parameters.
ERRORS: dict[protocol.Kind, Callable[..., Exception]] = {
    protocol.Kind.OVERFLOW: runtime.ContextOverflow,
    protocol.Kind.INVALID_MODEL: runtime.InvalidModel,
    protocol.Kind.INVALID_PARAMETER: InvalidParameter,
    protocol.Kind.INVALID_SAMPLING: runtime.InvalidSampling,
    protocol.Kind.CONSTRAINT: runtime.InvalidConstraint,
    protocol.Kind.SESSION_MISSING: runtime.SessionNotFound,
    protocol.Kind.SHIFT_UNSUPPORTED: runtime.ShiftUnsupported,
    protocol.Kind.VOCABULARY_MISMATCH: runtime.VocabularyMismatch,
    protocol.Kind.ADAPTER_MISMATCH: runtime.AdapterMismatch,
    protocol.Kind.NOT_A_VOICE: runtime.NotAVoice,
}


def varlink_error(failed: protocol.Failed) -> Exception:
    """The exception a worker's `Failed` stands for: the Runtime1 error
    ERRORS maps its kind to, or, with no kind, a RuntimeError."""
    if failed.kind is None:
        return RuntimeError(failed.message)
    try:
        return ERRORS[failed.kind](**failed.parameters)
    except (TypeError, ValueError):  # parameters the error does not take
        return RuntimeError(f"{failed.kind.value}: {failed.parameters}")


@dataclass(eq=False, slots=True)
class Call:
    """One call in flight: its events, and whether the worker is done with it."""

    id: int
    op: str
    label: str
    #: CLOCK_MONOTONIC when it was sent (the benchmark's trace).
    sent: float = 0.0
    #: The worker's replies (and Gone), each with its descriptors.
    events: asyncio.Queue[tuple[protocol.Reply | Gone, list[int]]] = \
        field(default_factory=asyncio.Queue)
    finished: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


def _drain(call: Call) -> None:
    """Close the descriptors of events nobody will read."""
    while not call.events.empty():
        for fd in call.events.get_nowait()[1]:
            with contextlib.suppress(OSError):
                os.close(fd)


class WorkerProcess:
    """One engine worker process and its socket."""

    _ids = itertools.count(1)

    def __init__(self, model: str, process: subprocess.Popen[bytes], sock: Any, cell: int,
                 on_exit: "Callable[[WorkerProcess, Exit, list[str]], None] | None" = None,
                 ) -> None:
        self.model = model
        self.process = process
        self.pid = process.pid
        self.cell = cell
        self.started = time.time()
        self.state = "starting"
        self.exit: Exit | None = None
        self.engine = ""
        self.system_info = ""
        #: Calls served (requests sent) since it started.
        self.served = 0
        #: Runs once when the process has ended: (worker, exit, labels of
        #: the calls it took down).
        self.on_exit = on_exit
        #: Resolves with the exit once the process has ended.
        self.ended: asyncio.Future[Exit] = asyncio.get_running_loop().create_future()
        self._calls: dict[int, Call] = {}
        self._stopping = False
        self._fatal: str | None = None
        self._loop = asyncio.get_running_loop()
        self.link = channel.Link(sock, self._message, self._closed)
        self._pidfd = os.pidfd_open(self.pid)
        self._loop.add_reader(self._pidfd, self._reaped)

    @classmethod
    async def start(cls, model: str, *, settings: dict[str, Any], engine: str,
                    board: int, cell: int,
                    on_exit: "Callable[[WorkerProcess, Exit, list[str]], None] | None" = None,
                    ) -> "WorkerProcess":
        """Start a worker for `model` and wait for its hello; WorkerGone
        when it dies or says it cannot start. `on_exit` runs once when the
        process has ended (its exit, and the calls it took down)."""
        ours, theirs = channel.pair()
        env = dict(os.environ)
        # placement.py numbers GPUs in PCI order: so does a GPU backend then.
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        env.update(SYNTROP_WORKER_FD=str(theirs.fileno()), SYNTROP_ENGINE=engine,
                   SYNTROP_WORKER=protocol.Settings(**settings, model=model, board=board,
                                                    cell=cell, parent=os.getpid()).to_json())
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "syntrop.runtimed.worker"],
                pass_fds=(theirs.fileno(), board), stdin=subprocess.DEVNULL,
                # llama.cpp prints to stdout now and then: into our log.
                stdout=sys.stderr.fileno(), env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        worker = cls(model, process, ours, cell, on_exit)
        try:
            hello = await asyncio.wait_for(worker.request(protocol.Hello(), label="start"),
                                           START_TIMEOUT)
        except TimeoutError:
            worker.kill()
            raise WorkerGone(model, None, f"did not start within {START_TIMEOUT:.0f} s") \
                from None
        except asyncio.CancelledError:
            worker.kill()
            raise
        worker.state = "ready"
        worker.engine = str(hello.get("engine", ""))
        worker.system_info = str(hello.get("system_info", ""))
        return worker

    @property
    def alive(self) -> bool:
        return self.exit is None and not self.link.closed

    @property
    def in_flight(self) -> list[str]:
        return [call.label for call in self._calls.values()]

    # calls ------------------------------------------------------------------

    def open(self, operation: protocol.Operation, fds: Sequence[int] = (), *,
             label: str = "") -> Call:
        """Send a call; its events arrive in `Call.events` (a stream's
        reader takes them from there: streams.py)."""
        if not self.alive:
            raise WorkerGone(self.model, self.exit, self.gone_reason())
        request = protocol.Request(next(self._ids), operation)
        call = Call(request.id, request.op, label or request.op, time.monotonic())
        self._calls[call.id] = call
        try:
            self.link.send(protocol.encode(request), fds)
        except OSError:
            del self._calls[call.id]
            raise WorkerGone(self.model, self.exit, self.gone_reason()) from None
        self.served += 1
        return call

    async def request(self, operation: protocol.Operation, fds: Sequence[int] = (),
                      *, label: str = "") -> dict[str, Any]:
        """One reply's result (a call's descriptors, if any, are closed)."""
        result, received = await self.request_fds(operation, fds, label=label)
        for fd in received:
            os.close(fd)
        return result

    async def request_fds(self, operation: protocol.Operation, fds: Sequence[int] = (),
                          *, label: str = "") -> tuple[dict[str, Any], list[int]]:
        """One reply's result and the descriptors that came with it."""
        call = self.open(operation, fds, label=label)
        try:
            while True:
                message, received = await call.events.get()
                if isinstance(message, protocol.Done):
                    return dict(message.result), received
                for fd in received:
                    os.close(fd)
                if not isinstance(message, protocol.Piece):
                    raise self.error(message)
        except asyncio.CancelledError:
            self.cancel(call)
            # What the worker still sends (a state memfd) goes nowhere: close it.
            call.finished.add_done_callback(lambda _: _drain(call))
            raise

    def cancel(self, call: Call) -> None:
        if self.alive and not call.finished.done():
            with contextlib.suppress(OSError):
                self.link.send(protocol.encode(protocol.Cancel(call.id)))

    def error(self, message: protocol.Failed | Gone) -> Exception:
        if isinstance(message, Gone):
            return WorkerGone(self.model, self.exit, self.gone_reason())
        return varlink_error(message)

    # the process ------------------------------------------------------------

    def _message(self, wire: dict[str, Any], fds: list[int]) -> None:
        try:
            message = protocol.decode(wire)
        except ValueError:
            message = None
        if isinstance(message, protocol.Fatal):
            self._fatal = message.message
        reply = message if isinstance(message, protocol.Piece | protocol.Done
                                      | protocol.Failed) else None
        call = self._calls.get(reply.id) if reply is not None else None
        if call is None or reply is None:  # fatal, or a late reply to a call given up on
            for fd in fds:
                os.close(fd)
            return
        call.events.put_nowait((reply, fds))
        if not isinstance(reply, protocol.Piece):
            del self._calls[call.id]
            call.finish()

    def _closed(self, why: str) -> None:
        if self.exit is None and not self._stopping:
            logger.debug("engine worker of %s closed its socket (%s)", self.model, why)
        # It should be exiting; if it is not, it has lost its way.
        self._loop.call_later(LINGER, self.kill)

    def _reaped(self) -> None:
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        returncode = self.process.wait()
        self.exit = Exit(returncode)
        self.state = "exited"
        self.ended.set_result(self.exit)
        self.link.close("exited")
        gone = list(self._calls.values())
        self._calls.clear()
        for call in gone:
            call.events.put_nowait((Gone(), []))
            call.finish()
        if self.on_exit is not None:
            self.on_exit(self, self.exit, [call.label for call in gone])

    def gone_reason(self) -> str:
        """How it ended (or could not start), in words."""
        if self._fatal:
            return self._fatal
        if self.exit is not None:
            return self.exit.describe()
        return "is gone"

    @property
    def expected(self) -> bool:
        """Whether it ended because runtimed asked it to."""
        return self._stopping

    def kill(self) -> None:
        if self.exit is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """Ask it to exit (its calls must be over); kill it if it lingers."""
        if self.exit is not None:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            self.link.send(protocol.encode(protocol.Exit()))
        try:
            await asyncio.wait_for(asyncio.shield(self.ended), STOP_TIMEOUT)
        except TimeoutError:
            self.kill()
            await self.ended
