"""Property tests: whatever a client sends, the daemon answers with a
well-formed reply or closes that connection, and a fresh client is served
right after. One running daemon takes every example.

Calls are only made to methods that have no effect (org.varlink.service,
unknown names, methods still unimplemented): random parameters to a real
method could acquire leases or freeze cgroups on the host. Domain methods
are fuzzed in the unit tier, against fakes.
"""

import json
import socket
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service.wire import (
    Reader,
    Running,
    connect,
    encode,
    get_info,
    idl,
    streaming,
    unimplemented,
)
from tests.support import BY_INTERFACE

INFERENCE = "io.syntrop.Inference1"
SERVICE = "org.varlink.service"
DAEMON = BY_INTERFACE[INFERENCE]
UNIMPLEMENTED = unimplemented(DAEMON)
STREAMING = streaming(DAEMON)

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)

harmless_methods = st.sampled_from(
    [
        f"{SERVICE}.GetInfo",
        f"{SERVICE}.GetInterfaceDescription",
        f"{SERVICE}.NoSuchMethod",
        f"{INFERENCE}.NoSuchMethod",
        "io.example.Nothing1.Get",
        *(f"{INFERENCE}.{name}" for name in UNIMPLEMENTED),
    ]
)

#: Errors a harmless call may get; anything else is a bug.
DECLARED = {
    f"{SERVICE}.InterfaceNotFound",
    f"{SERVICE}.MethodNotFound",
    f"{SERVICE}.MethodNotImplemented",
    f"{SERVICE}.InvalidParameter",
    f"{SERVICE}.ExpectedMore",
}


def _answer_or_close(daemon: Running, data: bytes) -> dict[str, Any] | None:
    """Send `data` on a fresh connection: the first reply, or None if the
    daemon closed the connection. Hanging is a failure (the read times out)."""
    with connect(daemon.socket, timeout=5) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return None
        sock.shutdown(socket.SHUT_WR)
        return Reader(sock).next()


def _still_served(daemon: Running) -> None:
    assert daemon.process.poll() is None, daemon.log_text()
    assert get_info(daemon.socket)["product"] == DAEMON.program


@SETTINGS
@given(data=st.binary(max_size=2048))
def test_random_bytes(inferenced: Running, data: bytes) -> None:
    reply = _answer_or_close(inferenced, data + b"\0")
    # Random bytes are never a call, so never answered.
    assert reply is None
    _still_served(inferenced)


@SETTINGS
@given(value=json_values)
def test_random_json_values(inferenced: Running, value: Any) -> None:
    reply = _answer_or_close(inferenced, json.dumps(value).encode() + b"\0")
    if reply is not None:
        # Only an object with a method string can be answered.
        assert isinstance(value, dict) and isinstance(value.get("method"), str), (value, reply)
        assert reply.get("error") in DECLARED, reply
    _still_served(inferenced)


@SETTINGS
@given(
    method=harmless_methods,
    parameters=st.dictionaries(
        st.sampled_from(["interface", "lease_id", "model", "prompt", "plane", "reason", "id"])
        | st.text(max_size=8),
        json_values,
        max_size=4,
    ),
    flag=st.sampled_from([None, "more", "oneway"]),
)
def test_random_calls_get_declared_errors(
    inferenced: Running, method: str, parameters: dict[str, Any], flag: str | None
) -> None:
    flags = {flag: True} if flag else {}
    with connect(inferenced.socket, timeout=5) as sock:
        # A GetInfo after the call proves the connection is still in order.
        sock.sendall(encode(method, parameters, **flags) + encode(f"{SERVICE}.GetInfo"))
        reader = Reader(sock)
        reply = reader.next()
        assert reply is not None, "closed on a well-formed call"
        if flag != "oneway":
            if "error" not in reply:
                assert method.startswith(SERVICE), reply
            else:
                assert reply["error"] in DECLARED, reply
                _check_error(method, parameters, flag, reply)
                reply = reader.next()
                assert reply is not None
        assert reply["parameters"]["product"] == DAEMON.program, reply
    _still_served(inferenced)


def _check_error(
    method: str, parameters: dict[str, Any], flag: str | None, reply: dict[str, Any]
) -> None:
    error = reply["error"]
    name = method.rsplit(".", 1)[1]
    if error == f"{SERVICE}.InvalidParameter":
        culprit = reply["parameters"]["parameter"]
        declared = set(_declared_parameters(method))
        assert culprit in set(parameters) | declared, (culprit, parameters)
    elif error == f"{SERVICE}.ExpectedMore":
        assert name in STREAMING and flag != "more", reply
    elif error == f"{SERVICE}.MethodNotImplemented":
        assert name in UNIMPLEMENTED, reply
        assert reply["parameters"] == {"method": name}


def _declared_parameters(method: str) -> list[str]:
    interface, name = method.rsplit(".", 1)
    if interface == SERVICE:
        return ["interface"] if name == "GetInterfaceDescription" else []
    if interface != INFERENCE:
        return []
    in_type = idl(DAEMON).get_method(name).in_type
    return list(in_type.fields)


def _wrong_values(vtype: Any) -> st.SearchStrategy[Any] | None:
    """JSON values that can never convert to the IDL type `vtype`, or None
    for types that take anything (object) or null (?T)."""
    from varlink.scanner import _Alias, _Array, _CustomType, _Dict, _Enum, _Maybe, _Object, _Struct

    interface = idl(DAEMON)
    while isinstance(vtype, _CustomType | _Alias):
        vtype = interface.members[vtype.name].type if isinstance(vtype, _CustomType) else vtype.type
    lists = st.lists(json_values, max_size=2)
    maps = st.dictionaries(st.text(max_size=4), json_values, max_size=2)
    if isinstance(vtype, _Maybe | _Object):
        return None
    if isinstance(vtype, bool):
        return st.text(max_size=6) | st.integers() | lists | maps
    if isinstance(vtype, int):
        return (
            st.text(max_size=6)
            | lists
            | maps
            | st.floats(allow_nan=False).filter(lambda f: not f.is_integer())
        )
    if isinstance(vtype, float):
        return st.text(max_size=6) | lists | maps
    if isinstance(vtype, str):
        return st.integers() | st.floats(allow_nan=False) | st.booleans() | lists | maps
    if isinstance(vtype, _Enum):
        return st.integers() | st.booleans() | lists | maps
    if isinstance(vtype, _Array):
        return st.text(max_size=6) | st.integers() | maps
    if isinstance(vtype, _Dict | set | _Struct):
        return st.text(max_size=6) | st.integers() | lists
    raise TypeError(f"unknown IDL type {vtype!r}")


def _mistypable() -> list[tuple[str, str, Any]]:
    """(method, parameter, IDL type) of every required, typed parameter."""
    interface = idl(DAEMON)
    found = []
    for name, member in interface.members.items():
        if hasattr(member, "in_type"):
            for parameter, vtype in member.in_type.fields.items():
                if _wrong_values(vtype) is not None:
                    found.append((name, parameter, vtype))
    return found


MISTYPABLE = _mistypable()


@st.composite
def mistyped_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    method, parameter, vtype = draw(st.sampled_from(MISTYPABLE))
    parameters = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    wrong = _wrong_values(vtype)
    assert wrong is not None
    parameters[parameter] = draw(wrong)
    return method, parameters, parameter


@SETTINGS
@given(case=mistyped_calls())
def test_mistyped_parameter_never_reaches_the_method(
    inferenced: Running, case: tuple[str, dict[str, Any], str]
) -> None:
    """Every method, implemented or not, with one required parameter of a
    type it can never have: InvalidParameter, before the method runs."""
    method, parameters, _ = case
    flags = {"more": True} if method in STREAMING else {}
    with connect(inferenced.socket, timeout=5) as sock:
        sock.sendall(encode(f"{INFERENCE}.{method}", parameters, **flags))
        reply = Reader(sock).next()
    assert reply is not None, "closed on a well-formed call"
    assert reply.get("error") == f"{SERVICE}.InvalidParameter", reply
    culprit = reply["parameters"]["parameter"]
    assert culprit in set(parameters) | set(_declared_parameters(f"{INFERENCE}.{method}")), reply
    _still_served(inferenced)
