"""syn pull: it resolves the reference and streams the bytes itself
(modeld's unit has no network), handing them to modeld through a pipe
passed with Model1.Pull; modeld hashes them in flight into a journaled
partial, verifies, stores and registers. A local path is handed over as a
descriptor with Model1.Register (reflinked where the filesystem can).
Transient failures (a dropped connection, a 5xx, modeld restarting) are
retried with backoff, each try resuming from what modeld kept; a server
that ignores Range is restarted from byte 0. The registries' client side
is syntrop.pull."""

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from syntrop.cli.modelclient import (
    IMPORT_TIMEOUT,
    STREAM_TIMEOUT,
    CliError,
    as_dict,
    connect_modeld,
    describe,
    human,
    run,
)

if TYPE_CHECKING:
    import httpx

    from syntrop.interfaces.model import Model, PullProgress
    from syntrop.modeld.refs import PathRef, Reference
    from syntrop.pull.registries import Artifact


# pull ----------------------------------------------------------------------------


class Display:
    """Progress on stderr: a rich bar on a terminal, plain lines otherwise,
    nothing with --json."""

    def __init__(self, reference: str, *, quiet: bool) -> None:
        self.reference = reference
        self.quiet = quiet
        self.bar: Any = None
        self.task: Any = None
        self.lock = threading.Lock()
        self.done = 0
        self.total: int | None = None
        self.next_line = 0.0
        self.last_phase = ""
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("resolving", total=None)

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def phase(self, phase: str, done: int, total: int | None) -> None:
        with self.lock:
            self.done, self.total = done, total
            changed, self.last_phase = phase != self.last_phase, phase
        if self.bar is not None:
            self.bar.update(self.task, description=phase, completed=done, total=total)
        elif changed and phase != "receiving":
            self.line(phase)

    def add(self, count: int) -> None:
        """Bytes sent to modeld (from the feeding thread)."""
        with self.lock:
            self.done += count
            done, total = self.done, self.total
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
        elif not self.quiet and time.monotonic() >= self.next_line:
            self.next_line = time.monotonic() + 1.0
            share = f" ({100 * done // total}%)" if total else ""
            print(f"  {human(done)} / {human(total)}{share}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class _Retry(Exception):
    """This try failed in a way the next try may fix."""

    def __init__(self, message: str, *, restart: bool = False) -> None:
        super().__init__(message)
        self.restart = restart


#: `syn pull packaged:NAME`: a model that packages installed beside
#: syntrop carry (syntrop.packaged: models and voices), registered under
#: NAME, pinned.
PACKAGED = "packaged:"


def _packaged(args: argparse.Namespace) -> str:
    """The file of `packaged:NAME` (its parts joined and verified), with
    args set to register it under NAME, verified and pinned."""
    from syntrop import packaged

    wanted = args.reference.removeprefix(PACKAGED)
    model = next((m for m in packaged.KNOWN if m.name == wanted), None)
    if model is None:
        known = ", ".join(PACKAGED + m.name for m in packaged.KNOWN)
        raise CliError(f"{args.reference}: no such packaged model (known: {known})")
    try:
        path = packaged.locate(model)
    except (OSError, ValueError) as error:
        raise CliError(f"{args.reference}: {error}") from None
    if path is None:
        raise CliError(f"{args.reference}: its packages ({', '.join(model.packages)}) are not "
                       "installed in this Python environment")
    args.name, args.sha256, args.pin = args.name or model.name, model.sha256, True
    return str(path)


def cmd_pull(args: argparse.Namespace) -> int:
    from syntrop.modeld import refs

    if args.reference.startswith(PACKAGED):
        model = run(_register_local(_packaged(args), args))
        print(json.dumps(as_dict(model)) if args.json else
              f"pulled {model.name}:{model.tag} sha256:{model.digest} ({human(model.size)}), "
              "pinned")
        return 0
    try:
        reference = refs.parse(args.reference)
        if isinstance(reference, refs.PathRef):
            reference = _bare_name(reference)
            args.reference = str(reference)  # messages and the source name what it became
    except refs.InvalidReference as error:
        raise CliError(str(error)) from None
    if args.name is not None:
        from syntrop.modeld import names

        try:
            names.parse(args.name)
        except names.InvalidName as error:
            raise CliError(f"{error}: a name or tag must not be empty, '.', '..', or contain "
                           "'/', ':', spaces or control characters") from None
    display = Display(args.reference, quiet=args.json)
    try:
        if isinstance(reference, refs.PathRef):
            model = run(_register_local(reference.path, args))
        else:
            model = _pull_remote(reference, args, display)
            if args.pin and not model.pinned:
                model = run(_pin_model(f"{model.name}:{model.tag}"))
    finally:
        display.close()
    if args.json:
        print(json.dumps(as_dict(model)))
    else:
        print(f"pulled {model.name}:{model.tag} sha256:{model.digest} ({human(model.size)})")
    return 0


#: NAME or NAME:TAG, as ollama pulls its models by.
_BARE = re.compile(r"[a-z0-9][a-z0-9._-]*(:[A-Za-z0-9._-]+)?")


def _bare_name(reference: "PathRef") -> "Reference":
    """A bare NAME[:TAG] that is no file here, as ollama's own CLI reads
    it: library/NAME:TAG of the configured default ollama-style registry.
    Without one configured, a message saying how to configure or name it."""
    from syntrop.config import ConfigError, paths
    from syntrop.modeld import refs
    from syntrop.pull.registries import Settings

    text = reference.path
    if os.path.lexists(text) or not _BARE.fullmatch(text):
        return reference
    configuration = paths().configuration
    try:
        endpoint = Settings.load(configuration, os.environ).ollama_endpoint
    except ConfigError as error:
        raise CliError(str(error)) from None
    if endpoint:
        return refs.parse(f"ollama://{text}")
    raise CliError(
        f"{text}: no such file here, and no default registry for bare names is configured. "
        f"Set endpoint in [ollama] of {configuration / 'pull.toml'} (or "
        f"$SYNTROP_OLLAMA_ENDPOINT) to pull it as ollama://library/{text}, or name the "
        f"registry: syn pull ollama://REGISTRY/library/{text}, or hf://ORG/REPO/FILE.gguf")


async def _register_local(path: str, args: argparse.Namespace) -> "Model":
    from asyncvarlink import FileDescriptor

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CliError(f"{path}: No such file or directory") from None
    except OSError as error:
        raise CliError(f"{path}: {error.strerror}") from None
    try:
        async with await connect_modeld(timeout=IMPORT_TIMEOUT) as model1:
            reply = await model1.Register(
                name=args.name or _default_name(path), fd=FileDescriptor(fd),
                sha256=args.sha256, pin=True if args.pin else None,
                source=os.path.abspath(path),
            )
            model = reply["model"]
    finally:
        os.close(fd)
    return model


async def _pin_model(name: str) -> "Model":
    async with await connect_modeld() as model1:
        await model1.Pin(name=name)
        return (await model1.Show(name=name))["model"]


def _default_name(text: str) -> str:
    from syntrop.modeld import refs

    return refs.default_name(refs.parse(text))


def _pull_remote(reference: "Reference", args: argparse.Namespace, display: Display) -> "Model":
    import httpx

    from syntrop.config import ConfigError, paths
    from syntrop.pull.addresses import guard
    from syntrop.pull.fetch import tune_for_bulk
    from syntrop.pull.registries import RegistryError, Settings, registry_for

    tune_for_bulk()
    try:
        settings = Settings.load(paths().configuration, os.environ,
                                 insecure=args.insecure or None, retries=args.retries)
    except ConfigError as error:
        raise CliError(str(error)) from None
    timeout = httpx.Timeout(settings.timeout, connect=min(10.0, settings.timeout))
    # Every request, each redirect hop too, is checked before it connects.
    hooks = {"request": [guard(settings.allowed)]}
    with httpx.Client(timeout=timeout, event_hooks=hooks) as http:
        registry = registry_for(reference, settings, http)
        attempt = 0
        while True:
            try:
                artifact = registry.resolve(reference)
                break
            except RegistryError as error:
                if not error.retryable or attempt >= settings.retries:
                    raise CliError(str(error)) from None
                attempt += 1
                _backoff(attempt, str(error), display)
        sha256 = _expected_digest(artifact, args.sha256, args.reference)
        display.line(f"pulling {args.reference}: {human(artifact.size)}, sha256:{sha256}")
        restart = False
        attempt = 0
        while True:
            try:
                model: Model = run(_transfer(args, artifact, sha256, http, display,
                                              restart=restart))
                return model
            except _Retry as retry:
                if retry.restart and not restart:
                    restart = True  # once, and it is not a failed try
                    display.line(f"{retry}; starting over from byte 0")
                    continue
                if retry.restart:
                    raise CliError(str(retry)) from None
                if attempt >= settings.retries:
                    raise CliError(f"{retry} (after {attempt + 1} tries; run the command again "
                                   "to resume)") from None
                attempt += 1
                _backoff(attempt, str(retry), display)
            except RegistryError as error:
                raise CliError(str(error)) from None


def _expected_digest(artifact: "Artifact", given: str | None, reference: str) -> str:
    from syntrop.modeld import names

    if given is not None:
        try:
            given = names.digest(given)
        except names.InvalidDigest:
            raise CliError(f"--sha256 {given!r} is not a SHA-256 in hex") from None
    if artifact.sha256 and given and artifact.sha256 != given:
        raise CliError(f"{reference}: the registry gives sha256 {artifact.sha256}, "
                       f"--sha256 says {given}; nothing was fetched")
    sha256 = artifact.sha256 or given
    if sha256 is None:
        raise CliError(f"{reference}: the server gives no SHA-256 to verify the bytes "
                       "against; pass --sha256")
    return sha256


def _backoff(attempt: int, reason: str, display: Display) -> None:
    delay = min(8.0, 0.5 * 2 ** (attempt - 1))
    display.line(f"{reason}; retrying in {delay:g} s")
    time.sleep(delay)


class _Feeder:
    """The HTTP side of one try: a thread writing the artifact into the pipe
    modeld reads, from the byte modeld names."""

    def __init__(self, args: argparse.Namespace, artifact: "Artifact", http: "httpx.Client",
                 display: Display) -> None:
        from syntrop.modeld.staging import set_pipe_size

        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC)
        set_pipe_size(self.write_end)
        self.args, self.artifact, self.http, self.display = args, artifact, http, display
        self.failure: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def _feed(self, offset: int) -> None:
        from syntrop.pull.fetch import StoreClosed, fetch
        from syntrop.pull.registries import RegistryError

        try:
            fetch(self.http, self.artifact, offset, self.write_end, what=self.args.reference,
                  on_bytes=self.display.add)
        except (RegistryError, StoreClosed) as error:
            self.failure.append(error)
        except Exception as error:  # reported by the caller, never a traceback
            self.failure.append(RegistryError(f"{self.args.reference}: {error}"))
        finally:
            os.close(self.write_end)

    def start(self, offset: int) -> None:
        self.thread = threading.Thread(target=self._feed, args=(offset,), name="syn-fetch",
                                       daemon=True)
        self.thread.start()

    def error(self, wait: float = 5.0) -> BaseException | None:
        """What went wrong on the HTTP side, once the feeder is done (it ends
        soon after modeld stops reading; not when the server stalls)."""
        from syntrop.pull.fetch import StoreClosed

        if self.thread is not None:
            self.thread.join(timeout=wait)
        errors = [e for e in self.failure if not isinstance(e, StoreClosed)]
        return errors[0] if errors else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.read_end)
        if self.thread is None:  # else the thread closes its end
            with contextlib.suppress(OSError):
                os.close(self.write_end)


def _show(progress: "PullProgress", feeder: _Feeder, display: Display) -> int | None:
    """Show a Pull reply's phase; on the first "receiving", start feeding
    from the byte modeld has, and return it."""
    if progress.phase == "receiving" and feeder.thread is None:
        if progress.completed_bytes:
            display.line(f"resuming at {human(progress.completed_bytes)}")
        display.phase("receiving", progress.completed_bytes, progress.total_bytes)
        feeder.start(progress.completed_bytes)
        return progress.completed_bytes
    if progress.phase == "waiting":
        display.phase("waiting for another pull of this blob", 0, progress.total_bytes)
    elif progress.phase == "verifying":
        display.phase("verifying", progress.completed_bytes, progress.total_bytes)
    return None


def _pull_failed(error: BaseException, cause: BaseException | None) -> BaseException:
    """What to raise for modeld's PullFailed: another try (from byte 0 when
    the server ignored the range), or the registry's error when trying again
    cannot help."""
    from syntrop.pull.fetch import RangeIgnored
    from syntrop.pull.registries import RegistryError

    if isinstance(cause, RangeIgnored):
        return _Retry(str(cause), restart=True)
    if isinstance(cause, RegistryError):
        return _Retry(str(cause)) if cause.retryable else cause
    return _Retry(describe(error))


async def _transfer(args: argparse.Namespace, artifact: "Artifact", sha256: str,
                    http: "httpx.Client", display: Display, *, restart: bool) -> "Model":
    """One try: a Pull call, with a thread feeding the pipe once modeld says
    from which byte."""
    from asyncvarlink import FileDescriptor

    from syntrop.interfaces.model import DigestMismatch, PullFailed
    from syntrop.pull.registries import RegistryError
    from syntrop.varlink.client import CallTimeout

    feeder = _Feeder(args, artifact, http, display)
    model = None
    resumed = 0
    try:
        client = await connect_modeld(timeout=STREAM_TIMEOUT)
        async with client as model1:
            replies = model1.Pull(
                reference=args.reference, name=args.name, sha256=sha256, size=artifact.size,
                fd=FileDescriptor(feeder.read_end), restart=restart or None,
            )
            async for reply in replies:
                started = _show(reply["progress"], feeder, display)
                resumed = started if started is not None else resumed
                if reply["model"] is not None:
                    model = reply["model"]
    except DigestMismatch as error:
        if resumed and not restart:
            # The kept part may be what is wrong (a partial damaged by a
            # power loss): one more try from byte 0 before giving up.
            raise _Retry(describe(error), restart=True) from None
        raise
    except PullFailed as error:
        raise _pull_failed(error, feeder.error()) from None
    except (ConnectionError, EOFError, CallTimeout) as error:
        cause = feeder.error(wait=0.2)
        if isinstance(cause, RegistryError) and not cause.retryable:
            raise cause from None
        raise _Retry(f"lost modeld during the pull ({error or type(error).__name__})") from None
    except CliError as error:
        if feeder.thread is not None:
            raise _Retry(str(error)) from None
        raise
    finally:
        feeder.close()
    cause = feeder.error()
    if model is None:
        if cause is not None:
            raise cause
        raise _Retry("modeld ended the pull without a model")
    return model
