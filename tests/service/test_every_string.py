"""Issue 35, item 3: arbitrary strings, lone surrogates included, in every
string parameter of every method of every interface. Each call gets a reply
within 2 s, the reply is a result or an error the interface (or
org.varlink.service) declares, and the daemon logs no traceback.

Each of the seven daemons runs once for this module, socket-activated in a
private root whose system bus address points at nothing (no daemon reaches
the host's systemd, whatever it is sent); toold's unit directories are
inside that root too. Methods and their parameters come from the contract
classes: every method with a `str` somewhere in its parameters (top level,
in an optional, a list, or a dataclass field) is called. Its strings are
drawn from st.text() mixed with lone surrogates, surrogate pairs, NUL and
very long strings; every other parameter gets its simplest valid value
(None where optional, 0, 0.0, False, [], {}; a dataclass its fields).

A string that holds a lone surrogate once the JSON is decoded must be
refused with org.varlink.service.InvalidParameter naming a parameter that
holds one (JSON can spell such a string; UTF-8 cannot carry it further).

No method that takes a string is skipped (those that take none are not
called); what keeps the calls harmless, judged per method:

- inferenced AcquireLease, AcquireCompositeLease, RegisterModel: the
  memory sizes are 0, which each refuses, so nothing is granted or stored
  whatever the strings say. Freeze, Thaw, ReleaseLease, Yield and
  AcquireBuffer name no lease that exists. Quarantine could only mark a
  plane of this private root's state, and only for a string that is exactly
  a plane id.
- modeld Register opens `path` read-only and copies it into the private
  store (a random string names no file; a directory is refused); Pull
  needs a 64-hex sha256, which no drawn string is, so it fetches nothing.
- toold Execute and ExecutePlan: a drawn tool name names no tool (refused
  and audited in the private root); there is no bus to act through anyway.
- systemd-sentry Triage: only strings that are not valid unit names are
  sent (a valid one would start a real triage of that unit, which is not
  this test's business; the few dropped are of no account). ResetBreaker
  only clears a record of the private store.
- runtimed: every model named is unknown (no modeld beside it), so nothing
  loads.
"""

import contextlib
import dataclasses
import json
import re
import time
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from syntrop.cli.launcher import DAEMONS, Daemon
from syntrop.sentry.service import valid_unit_name
from syntrop.varlink.contract import Interface
from tests.service.wire import (
    Reader,
    Running,
    assert_no_traceback,
    connect,
    running,
    service_class,
    streaming,
)

#: Seconds a call may take to be answered.
REPLY_TIMEOUT = 2.0
SERVICE = "org.varlink.service"
INVALID = f"{SERVICE}.InvalidParameter"
STANDARD_ERRORS = frozenset(
    f"{SERVICE}.{name}"
    for name in (
        "InterfaceNotFound",
        "MethodNotFound",
        "MethodNotImplemented",
        "InvalidParameter",
        "PermissionDenied",
        "ExpectedMore",
    )
)
#: Examples per method: 39 methods take about 20 s on two cores.
EXAMPLES = 100

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# strings ---------------------------------------------------------------------

SPECIAL = [
    "",
    "\ud800",  # a lone high surrogate
    "\udfff",  # a lone low surrogate
    "\udc00\ud800",  # a pair in the wrong order
    "x\ud83d",  # a high surrogate at the end
    "\ud83dy",  # a high surrogate followed by no low one
    "\ud83d\ude00",  # a pair: once decoded, a valid emoji
    "\U0001f600",
    "\0",
    "a\0b",
    "\x7f\x1b[0m\n\r\t",
    "é" * 100,
    "x" * 65_536,
    "x" * (1 << 20 | 1),
    "\ud800" * 1000,
    "io.syntrop.Nothing1",
    "../../etc/passwd",
    "/",
    "foo.service",
    "-",
    "%",
    "@.service",
]

#: Words the contracts take, so that some calls get past the first check.
WORDS = ["Interactive", "Batch", "user", "assistant", "all-or-nothing", "tensor", "unit_file"]

#: Pieces that strings are glued from: a high and a low half in a row make
#: a pair, anything else around them leaves them alone.
PIECES = ["\ud83d", "\ude00", "\ud800", "\udfff", "\0", "é", "\U0001f600"]

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)

strings = st.one_of(
    st.text(),
    st.sampled_from(SPECIAL),
    st.sampled_from(WORDS),
    # Surrogates among other characters: lone ones, and pairs by chance.
    st.text(alphabet=surrogates | st.characters(), max_size=12),
    st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=4).map("".join),
)


def _decoded(value: Any) -> Any:
    """`value` as the daemon sees it: through JSON with ASCII escapes, which
    join a high and a low surrogate into one character."""
    return json.loads(json.dumps(value, ensure_ascii=True))


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return re.search("[\ud800-\udfff]", value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


# parameters from the contract ------------------------------------------------


def _optional(hint: Any) -> Any | None:
    """T for `T | None`, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def _holds_str(hint: Any, seen: frozenset[Any] = frozenset()) -> bool:
    """Whether a value of type `hint` can hold a string we draw."""
    if hint is str:
        return True
    if hint is Any or hint is object:
        return True  # a foreign object: drawn as {"unit": <string>}
    inner = _optional(hint)
    if inner is not None:
        return _holds_str(inner, seen)
    if typing.get_origin(hint) is list:
        return _holds_str(typing.get_args(hint)[0], seen)
    if dataclasses.is_dataclass(hint) and hint not in seen:
        hints = typing.get_type_hints(hint)
        return any(_holds_str(h, seen | {hint}) for h in hints.values())
    return False


def _values(hint: Any) -> st.SearchStrategy[Any]:
    """JSON values of type `hint`: drawn strings wherever a string goes,
    the simplest valid value everywhere else."""
    if hint is str:
        return strings
    if hint is Any or hint is object:
        return st.just({}) | st.fixed_dictionaries({"unit": strings})
    inner = _optional(hint)
    if inner is not None:
        return st.none() | _values(inner) if _holds_str(inner) else st.none()
    if typing.get_origin(hint) is list:
        item = typing.get_args(hint)[0]
        return st.lists(_values(item), max_size=2) if _holds_str(item) else st.just([])
    if typing.get_origin(hint) is dict:
        return st.just({})
    if hint is bool:
        return st.just(False)
    if hint is int:
        return st.just(0)
    if hint is float:
        return st.just(0.0)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        return st.fixed_dictionaries(
            {field.name: _values(hints[field.name]) for field in dataclasses.fields(hint)}
        )
    raise TypeError(f"no values for {hint!r}")


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Target:
    """A method to call: its parameters' types, whether it streams, and
    the errors it may answer."""

    daemon: Daemon
    method: str
    hints: dict[str, Any]
    more: bool
    declared: frozenset[str]

    @property
    def full_name(self) -> str:
        return f"{self.daemon.interface}.{self.method}"

    def __str__(self) -> str:
        return f"{self.daemon.program}-{self.method}"


def _contract(daemon: Daemon) -> type[Interface]:
    """The contract class the daemon's service class implements."""
    return next(
        base
        for base in service_class(daemon).__mro__
        if issubclass(base, Interface)
        and base.name == daemon.interface
        and base.__module__.startswith("syntrop.interfaces.")
    )


def _targets() -> list[Target]:
    found = []
    for daemon in DAEMONS:
        contract = _contract(daemon)
        more = streaming(daemon)
        declared = frozenset(error.name for error in contract.errors) | STANDARD_ERRORS
        for name, raw in contract.contract_methods():
            hints = typing.get_type_hints(raw)
            hints.pop("return", None)
            if any(_holds_str(hint) for hint in hints.values()):
                found.append(Target(daemon, name, hints, name in more, declared))
    return found


TARGETS = _targets()


def _guard(target: Target) -> Callable[[dict[str, Any]], bool]:
    """Which drawn calls may be sent to `target` (see the module's text)."""
    if target.daemon.program == "systemd-sentry" and target.method == "Triage":
        return lambda parameters: not valid_unit_name(_decoded(parameters)["unit"])
    return lambda parameters: True


# daemons -------------------------------------------------------------------


def _isolated_config(root: Path) -> None:
    """toold acts inside `root` only (as tests/service/test_toold.py does)."""
    for name in ("config", "etc", "run-units", "cache-toold"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "config" / "toold.toml").write_text(
        f'unit_dirs = ["{root}/etc", "{root}/run-units"]\n'
        f'cache_root = "{root}/cache-toold"\n'
        f'dbus_address = "unix:path={root}/no-bus"\n'
    )


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Running]]:
    """The seven daemons by program, each in a root of its own, for the
    whole module; at its end every one must be alive, answering, and
    without a traceback in its log."""
    with contextlib.ExitStack() as stack:
        started = {}
        for daemon in DAEMONS:
            root = tmp_path_factory.mktemp(f"strings-{daemon.program}")
            _isolated_config(root)
            no_bus = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={root}/no-bus"}
            started[daemon.program] = stack.enter_context(running(daemon, root, extra_env=no_bus))
        yield started
        for each in started.values():
            each.assert_healthy()


# the calls -----------------------------------------------------------------


def _send(daemon: Running, target: Target, parameters: dict[str, Any]) -> dict[str, Any]:
    """One call on a fresh connection: its (first) reply, within 2 s."""
    message: dict[str, Any] = {"method": target.full_name, "parameters": parameters}
    if target.more:
        message["more"] = True
    data = json.dumps(message, ensure_ascii=True).encode() + b"\0"
    started = time.monotonic()
    with connect(daemon.socket, timeout=REPLY_TIMEOUT) as sock:
        sock.sendall(data)
        try:
            reply = Reader(sock).next()
        except TimeoutError:
            raise AssertionError(
                f"{target.full_name} did not answer within {REPLY_TIMEOUT} s"
            ) from None
    took = time.monotonic() - started
    assert took < REPLY_TIMEOUT, f"{target.full_name} answered after {took:.2f} s"
    assert reply is not None, f"{target.full_name}: the daemon closed the connection"
    return reply


def _check(target: Target, parameters: dict[str, Any], reply: dict[str, Any]) -> None:
    """The reply is what the contract allows for these parameters."""
    error = reply.get("error")
    decoded = _decoded(parameters)
    lone = {name for name, value in decoded.items() if _has_lone_surrogate(value)}
    if lone:
        assert error == INVALID, (target.full_name, reply)
        assert reply["parameters"]["parameter"] in lone, (target.full_name, reply, lone)
        return
    if error is None:
        assert isinstance(reply.get("parameters", {}), dict), reply
        return
    assert error in target.declared, f"{target.full_name} answered an undeclared {error}"
    assert error != f"{target.daemon.interface}.InternalError", (
        f"{target.full_name} failed unexpectedly: {reply}"
    )
    assert error != f"{SERVICE}.ExpectedMore", reply
    if error == INVALID:
        named = reply["parameters"]["parameter"]
        assert re.split(r"[.\[]", named)[0] in target.hints, (target.full_name, reply)


def _calls(target: Target) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({name: _values(hint) for name, hint in target.hints.items()})


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_every_string_parameter(daemons: dict[str, Running], target: Target) -> None:
    daemon = daemons[target.daemon.program]
    guard = _guard(target)

    @SETTINGS
    @given(parameters=_calls(target))
    def run(parameters: dict[str, Any]) -> None:
        assume(guard(parameters))
        reply = _send(daemon, target, parameters)
        _check(target, parameters, reply)
        assert daemon.process.poll() is None, daemon.log_text()

    run()
    assert_no_traceback(daemon.log_text())
