"""What syn's model commands share: the one-line error they report,
sizes for people, modeld's errors in words, a connection to modeld and a
call run to its end, a model shown as a table."""

import argparse
import asyncio
import dataclasses
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Model1Client
    from syntrop.interfaces.model import Model


class CliError(Exception):
    """A failure to report in one line, `syn: …` (see _guarded)."""


#: Seconds a pull waits for a reply from modeld; it sends one at least every 5 s.
STREAM_TIMEOUT = 120.0
#: Seconds an import may take (hashing a large local file).
IMPORT_TIMEOUT = 3600.0
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from 1024, 500M, 2.5G, 10GiB (binary units)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    power = " KMGTP".index(match[2].upper() or " ")
    return int(float(match[1]) * 1024**power)


def human(size: int | None) -> str:
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def describe(error: BaseException) -> str:
    """One line for a Varlink error from modeld."""
    from asyncvarlink import VarlinkErrorReply
    from asyncvarlink.serviceerrors import InvalidParameter, PermissionDenied

    from syntrop.interfaces import model as m

    match error:
        case m.InvalidIdentifier():
            return (f"invalid model name {error.p_identifier!r}: a name or tag must not be "
                    "empty, '.', '..', or contain '/', ':', spaces or control characters")
        case m.ModelNotFound():
            return f"no model named {error.p_name}"
        case m.DigestMismatch():
            return (f"the bytes do not match their SHA-256 (expected {error.p_expected}, "
                    f"got {error.p_actual}); nothing was stored")
        case m.StoreFull():
            return (f"not enough space in the model store: {human(error.p_required)} "
                    f"needed, {human(error.p_available)} free; nothing was written")
        case m.ModelInUse():
            return f"{error.p_name} is in use (a descriptor of it is open); not removed"
        case m.InvalidReference() | m.PullFailed():
            return f"{error.p_reference}: {error.p_reason}"
        case m.InvalidModel():
            return f"not a model file: {error.p_reason}"
        case m.NotAuthorized() | PermissionDenied():
            action = error.parameters.get("action", "io.syntrop.model.manage")
            return (f"not authorized ({action}): "
                    "run it as root, or as a member of the syntrop group")
        case InvalidParameter():
            return f"modeld refused the parameter {error.p_parameter!r}"
        case VarlinkErrorReply() if error.name == f"{m.NAME}.InternalError":
            return (f"modeld failed in {error.paramstojson().get('method')} in a way it did "
                    "not foresee; its journal says why")
        case VarlinkErrorReply():
            return f"modeld answered {error.name}"
    return f"modeld answered {type(error).__name__}"


async def connect_modeld(timeout: float = 45.0) -> "Model1Client":
    from syntrop.interfaces.model import Model1
    from syntrop.varlink.client import address_of, connect

    try:
        return await connect(Model1, timeout=timeout)
    except OSError as error:
        raise CliError(
            f"cannot reach modeld at {address_of(Model1)}: {error.strerror or error} "
            "(start it: `syn up` with $RUNTIME_DIRECTORY set, or systemctl start modeld.socket)"
        ) from None


def run(coroutine: Any) -> Any:
    """Run a coroutine; Varlink errors and a vanished daemon become CliError."""
    from asyncvarlink import VarlinkErrorReply

    from syntrop.varlink.client import CallTimeout

    try:
        return asyncio.run(coroutine)
    except VarlinkErrorReply as error:
        raise CliError(describe(error)) from None
    except CallTimeout as error:
        raise CliError(f"modeld did not answer: {error}") from None
    except (ConnectionError, EOFError) as error:
        raise CliError(f"lost the connection to modeld ({error or type(error).__name__})") from None


def as_dict(model: "Model") -> dict[str, Any]:
    return dataclasses.asdict(model)


def print_model(model: "Model") -> None:
    rows = {
        "name": f"{model.name}:{model.tag}",
        "size": f"{human(model.size)} ({model.size} bytes)",
        "format": model.format,
        "architecture": model.architecture or "-",
        "quantization": model.quantization or "-",
        "license": model.license or "-",
        "sha256": model.digest,
        "pinned": "yes" if model.pinned else "no",
        "last used": time.strftime("%Y-%m-%d %H:%M:%S",
                                   time.localtime(model.last_access_usec / 1e6)),
        "source": model.source or "-",
    }
    width = max(len(key) for key in rows)
    for key, value in rows.items():
        print(f"{key + ':':{width + 1}} {value}")
