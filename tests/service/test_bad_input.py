"""Bad input never crashes a daemon: protocol garbage closes that one
connection, a bad call gets a declared Varlink error naming what was wrong,
and every other client goes on being served. Each test ends by checking the
daemon is alive, answers, and logged no traceback."""

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop.cli.launcher import Daemon
from tests.service.wire import (
    Reader,
    Running,
    call,
    closed_by_peer,
    connect,
    encode,
    error_of,
    get_info,
    idl,
    send_raw,
    service_class,
    streaming,
    valid_parameters,
    wait_for,
)

MiB = 1024 * 1024
LIMIT = 16 * MiB
INFERENCE = "io.syntrop.Inference1"
SERVICE = "org.varlink.service"
INVALID = f"{SERVICE}.InvalidParameter"

NOT_VARLINK = {
    "malformed json": b"{not json\0",
    "truncated json": b'{"method": "org.varlink.service.GetInfo"\0',
    "json array": b"[]\0",
    "json null": b"null\0",
    "json string": b'"org.varlink.service.GetInfo"\0',
    "json number": b"42\0",
    "empty message": b"\0",
    "invalid utf-8": b'{"method": "\xff\xfe"}\0',
    "no method": b'{"parameters": {}}\0',
    "method not a string": b'{"method": 5}\0',
    "method without interface": b'{"method": "GetInfo"}\0',
    "parameters not an object": b'{"method": "org.varlink.service.GetInfo", "parameters": [1]}\0',
    "more not a bool": b'{"method": "org.varlink.service.GetInfo", "more": "yes"}\0',
    "oneway and more": b'{"method": "org.varlink.service.GetInfo", "more": true, "oneway": true}\0',
    "deep nesting": b'{"method": "a.b.C", "parameters": {"x": ' + b"[" * 200_000 + b"\0",
    "huge number": b'{"method": "a.b.C", "parameters": {"x": ' + b"9" * 10_000 + b"}}\0",
}


@pytest.fixture(autouse=True)
def _healthy_after(inferenced: Running) -> Iterator[None]:
    """Whatever a test threw at it, the shared daemon is alive, answers and
    logged no traceback (checked again, after the test's own checks)."""
    yield
    inferenced.assert_healthy()


def _idle_connection(path: Path) -> socket.socket:
    """A connection that has completed one call and now just sits there."""
    sock = connect(path)
    sock.sendall(encode(f"{SERVICE}.GetInfo"))
    reply = Reader(sock).next()
    assert reply is not None and "parameters" in reply
    return sock


def _assert_still_serves(sock: socket.socket) -> None:
    sock.sendall(encode(f"{SERVICE}.GetInfo"))
    reply = Reader(sock).next()
    assert reply is not None and reply["parameters"]["vendor"] == "syntrop"


# protocol garbage ----------------------------------------------------------


@pytest.mark.parametrize("data", NOT_VARLINK.values(), ids=NOT_VARLINK.keys())
def test_not_varlink_closes_only_that_connection(inferenced: Running, data: bytes) -> None:
    with _idle_connection(inferenced.socket) as bystander:
        assert send_raw(inferenced.socket, data) is None
        _assert_still_serves(bystander)
    inferenced.assert_healthy()


def test_garbage_after_a_good_call_is_answered_then_closed(inferenced: Running) -> None:
    with connect(inferenced.socket) as sock:
        sock.sendall(encode(f"{SERVICE}.GetInfo") + b"{garbage\0")
        reader = Reader(sock)
        first = reader.next()
        assert first is not None and first["parameters"]["product"] == "inferenced"
        assert reader.next() is None
    inferenced.assert_healthy()


def test_unterminated_message_held_open_blocks_nobody(inferenced: Running) -> None:
    with connect(inferenced.socket) as holder:
        holder.sendall(b'{"method": "org.varlink.service.GetInfo"')
        for _ in range(3):
            assert get_info(inferenced.socket)["product"] == "inferenced"
        # The partial message was kept, not dropped: finishing it gets a reply.
        holder.sendall(b"}\0")
        reply = Reader(holder).next()
        assert reply is not None and reply["parameters"]["product"] == "inferenced"
    inferenced.assert_healthy()


def test_message_over_16_mib_closes_that_connection(inferenced: Running) -> None:
    with _idle_connection(inferenced.socket) as bystander, connect(inferenced.socket) as flooder:
        chunk = b"x" * MiB
        sent = 0
        try:
            while sent <= LIMIT + MiB:
                flooder.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_peer(flooder)
        assert sent <= LIMIT + MiB + len(chunk)
        _assert_still_serves(bystander)
    inferenced.assert_healthy()


def test_call_over_16_mib_is_refused(inferenced: Running) -> None:
    data = encode(f"{SERVICE}.GetInterfaceDescription", {"interface": "x" * (LIMIT + 1)})
    assert send_raw(inferenced.socket, data) is None
    inferenced.assert_healthy()


def test_call_of_exactly_16_mib_is_answered(inferenced: Running) -> None:
    # Padded with an unknown top-level field, which a server ignores.
    call = b'{"method": "org.varlink.service.GetInfo", "padding": "'
    data = call + b"x" * (LIMIT - len(call) - 2) + b'"}'
    assert len(data) == LIMIT
    reply = send_raw(inferenced.socket, data + b"\0")
    assert reply is not None and reply["parameters"]["product"] == "inferenced"
    inferenced.assert_healthy()


# declared errors -----------------------------------------------------------


def test_unknown_interface(inferenced: Running) -> None:
    reply = call(inferenced.socket, "io.example.Nothing1.Get")
    assert error_of(reply) == f"{SERVICE}.InterfaceNotFound"
    assert reply is not None and reply["parameters"] == {"interface": "io.example.Nothing1"}
    reply = call(
        inferenced.socket,
        f"{SERVICE}.GetInterfaceDescription",
        {"interface": "io.example.Nothing1"},
    )
    assert error_of(reply) == f"{SERVICE}.InterfaceNotFound"


def test_unknown_method(inferenced: Running) -> None:
    reply = call(inferenced.socket, f"{INFERENCE}.NoSuchMethod")
    assert error_of(reply) == f"{SERVICE}.MethodNotFound"
    assert reply is not None and reply["parameters"] == {"method": "NoSuchMethod"}
    # Python attributes of the service object are never called: their names
    # are not Varlink method names, so the call is garbage and closes.
    for name in ("__init__", "paths", "name", "render_interface_description"):
        assert call(inferenced.socket, f"{INFERENCE}.{name}") is None, name
    inferenced.assert_healthy()


LEASE = {"priority": "Batch", "memory_bytes": 1, "plane": None, "unit": None, "pid": None}
SLICE = {"plane_id": "cpu", "role": "tensor", "stage_index": None, "memory_bytes": 1}
GANG = {
    "gang_id": "g",
    "slices": [SLICE],
    "gang_policy": "all-or-nothing",
    "priority": "Batch",
    "client_unit": None,
}

WRONG_TYPES = [
    ("ReleaseLease", {"lease_id": 5}, "lease_id"),
    ("ReleaseLease", {"lease_id": None}, "lease_id"),
    ("ReleaseLease", {"lease_id": ["a"]}, "lease_id"),
    ("ReleaseLease", {"lease_id": {"a": "b"}}, "lease_id"),
    ("AcquireLease", {**LEASE, "memory_bytes": "1"}, "memory_bytes"),
    ("AcquireLease", {**LEASE, "memory_bytes": 1.5}, "memory_bytes"),
    ("AcquireLease", {**LEASE, "priority": 100}, "priority"),
    ("AcquireLease", {**LEASE, "plane": 7}, "plane"),
    ("AcquireLease", {**LEASE, "pid": "self"}, "pid"),
    ("AcquireCompositeLease", {**GANG, "slices": "cpu"}, "slices"),
    ("AcquireCompositeLease", {**GANG, "slices": [{**SLICE, "memory_bytes": "1"}]}, "slices"),
    ("AcquireCompositeLease", {**GANG, "slices": [{**SLICE, "unknown": 1}]}, "slices"),
    ("AcquireCompositeLease", {**GANG, "slices": [5]}, "slices"),
    ("StreamInference", {"model": 1, "prompt": "p"}, "model"),
]


@pytest.mark.parametrize(
    ("method", "parameters", "culprit"),
    WRONG_TYPES,
    ids=[f"{m}-{c}-{i}" for i, (m, _, c) in enumerate(WRONG_TYPES)],
)
def test_wrong_parameter_type_names_the_parameter(
    inferenced: Running, method: str, parameters: dict[str, object], culprit: str
) -> None:
    more = method == "StreamInference"
    reply = call(
        inferenced.socket, f"{INFERENCE}.{method}", parameters, **({"more": True} if more else {})
    )
    assert error_of(reply) == INVALID
    assert reply is not None and reply["parameters"] == {"parameter": culprit}
    inferenced.assert_healthy()


def test_boolean_for_an_int_is_invalid_parameter(inferenced: Running) -> None:
    # The priority is bad too, so that the call cannot succeed meanwhile.
    parameters = {**LEASE, "priority": "NoSuchPriority", "memory_bytes": True}
    reply = call(inferenced.socket, f"{INFERENCE}.AcquireLease", parameters)
    assert error_of(reply) == INVALID
    assert reply is not None and reply["parameters"] == {"parameter": "memory_bytes"}


def test_missing_parameter_is_named(inferenced: Running) -> None:
    nothing: list[dict[str, object] | None] = [{}, None]
    for parameters in nothing:
        reply = call(inferenced.socket, f"{INFERENCE}.ReleaseLease", parameters)
        assert error_of(reply) == INVALID
        assert reply is not None and reply["parameters"] == {"parameter": "lease_id"}
    without_memory = {key: value for key, value in LEASE.items() if key != "memory_bytes"}
    reply = call(inferenced.socket, f"{INFERENCE}.AcquireLease", without_memory)
    assert reply is not None and reply["parameters"] == {"parameter": "memory_bytes"}
    inferenced.assert_healthy()


def test_optional_parameters_may_be_left_out(inferenced: Running) -> None:
    # ?type fields may be absent (python-varlink leaves out what is null).
    # The priority is bad on purpose: whatever AcquireLease does, it must
    # not complain about the optional fields that were left out.
    omitted = {"plane", "unit", "pid"}
    reply = call(
        inferenced.socket,
        f"{INFERENCE}.AcquireLease",
        {"priority": "NoSuchPriority", "memory_bytes": 1},
    )
    assert error_of(reply) is not None
    assert reply is not None and reply.get("parameters", {}).get("parameter") not in omitted
    inferenced.assert_healthy()


def test_extra_parameter_is_named(inferenced: Running) -> None:
    reply = call(inferenced.socket, f"{INFERENCE}.ReleaseLease", {"lease_id": "l", "force": True})
    assert error_of(reply) == INVALID
    assert reply is not None and reply["parameters"] == {"parameter": "force"}
    reply = call(inferenced.socket, f"{SERVICE}.GetInfo", {"verbose": True})
    assert reply is not None and reply["parameters"] == {"parameter": "verbose"}
    inferenced.assert_healthy()


def test_streaming_method_without_more_gets_declared_expected_more(inferenced: Running) -> None:
    reply = call(inferenced.socket, f"{INFERENCE}.StreamInference", {"model": "m", "prompt": "p"})
    assert error_of(reply) == f"{SERVICE}.ExpectedMore"
    description = call(
        inferenced.socket, f"{SERVICE}.GetInterfaceDescription", {"interface": SERVICE}
    )
    assert description is not None
    assert "error ExpectedMore" in description["parameters"]["description"]
    inferenced.assert_healthy()


def test_upgrade_is_refused_with_a_declared_error(inferenced: Running) -> None:
    reply = call(inferenced.socket, f"{SERVICE}.GetInfo", upgrade=True)
    assert error_of(reply) == INVALID
    inferenced.assert_healthy()


def test_more_on_a_plain_method_gets_one_final_reply(inferenced: Running) -> None:
    with connect(inferenced.socket) as sock:
        sock.sendall(encode(f"{SERVICE}.GetInfo", more=True))
        reply = Reader(sock).next()
    assert reply is not None and reply["parameters"]["product"] == "inferenced"
    assert not reply.get("continues")


# ordering on one connection ------------------------------------------------


def test_pipelined_calls_answered_in_order_oneway_skipped(inferenced: Running) -> None:
    with connect(inferenced.socket) as sock:
        sock.sendall(
            encode(f"{SERVICE}.GetInfo", oneway=True)
            + encode(f"{SERVICE}.GetInfo")
            + encode(f"{INFERENCE}.Nope")
            + encode(f"{INFERENCE}.StreamInference", {"model": "m", "prompt": "p"})
            + encode(f"{SERVICE}.GetInterfaceDescription", {"interface": INFERENCE})
        )
        reader = Reader(sock)
        replies = [reader.next() for _ in range(4)]
        sock.shutdown(socket.SHUT_WR)
        assert reader.next() is None  # nothing more: the oneway call got no reply
    assert replies[0] is not None and replies[0]["parameters"]["product"] == "inferenced"
    assert error_of(replies[1]) == f"{SERVICE}.MethodNotFound"
    assert error_of(replies[2]) == f"{SERVICE}.ExpectedMore"
    assert (
        replies[3] is not None
        and "interface io.syntrop.Inference1" in replies[3]["parameters"]["description"]
    )
    inferenced.assert_healthy()


def test_half_closed_client_still_gets_its_reply(inferenced: Running) -> None:
    # A lease that does not exist: an error either way (not implemented, or
    # not found), but an answer, and from a method that may run as a task.
    with connect(inferenced.socket) as sock:
        sock.sendall(encode(f"{INFERENCE}.ReleaseLease", {"lease_id": "no-such-lease"}))
        sock.shutdown(socket.SHUT_WR)
        reader = Reader(sock)
        reply = reader.next()
        assert reply is not None and str(reply.get("error")).startswith(
            ("org.varlink.service.", INFERENCE)
        )
        assert reader.next() is None
    inferenced.assert_healthy()


# clients that go away ------------------------------------------------------


def test_clients_vanishing_mid_call_leak_nothing(inferenced: Running) -> None:
    get_info(inferenced.socket)
    baseline = inferenced.settled_fds()
    calls = [
        encode(f"{INFERENCE}.ReleaseLease", {"lease_id": "no-such-lease"}),
        encode(
            f"{INFERENCE}.StreamInference", {"model": "no-such-model", "prompt": "p"}, more=True
        ),
        encode(f"{SERVICE}.GetInfo"),
        encode(f"{INFERENCE}.ListLeases") + encode(f"{SERVICE}.GetInfo") * 10,
        encode(f"{INFERENCE}.StreamInference", {"model": "no-such-model", "prompt": "p"}, more=True)
        * 5,
    ]
    for _ in range(20):
        for data in calls:
            with connect(inferenced.socket) as sock:
                sock.sendall(data)
            # And the rude way: a reset instead of a FIN.
            with connect(inferenced.socket) as sock:
                sock.sendall(data)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    wait_for(
        lambda: inferenced.open_fds() <= baseline,
        5,
        lambda: (
            f"daemon kept descriptors of vanished clients: {inferenced.open_fds()} > {baseline}"
        ),
    )
    inferenced.assert_healthy()


# the same checks against every daemon --------------------------------------


def _typed_parameter(daemon: Daemon) -> tuple[str, str, dict[str, object], bool]:
    """A method with a required parameter: (method, parameter, valid
    parameters, streaming). Calls with that parameter wrong never reach the
    method, implemented or not."""
    interface = idl(daemon)
    for name, _ in service_class(daemon).contract_methods():
        parameters = valid_parameters(interface, name)
        required = [key for key, value in parameters.items() if value is not None]
        if required:
            return name, required[0], parameters, name in streaming(daemon)
    raise AssertionError(f"{daemon.interface} has no method with a required parameter")


def test_every_daemon_survives_bad_input(served: Running) -> None:
    daemon = served.daemon
    name = daemon.interface
    with _idle_connection(served.socket) as bystander:
        for data in (b"{not json\0", b"[]\0", b'{"method": 1}\0'):
            assert send_raw(served.socket, data) is None
        assert (
            error_of(call(served.socket, "io.example.Nothing1.Get"))
            == f"{SERVICE}.InterfaceNotFound"
        )
        assert error_of(call(served.socket, f"{name}.NoSuchMethod")) == f"{SERVICE}.MethodNotFound"

        method, parameter, parameters, more = _typed_parameter(daemon)
        flags = {"more": True} if more else {}
        wrong = 5 if isinstance(parameters[parameter], str) else "5"
        for bad in (
            {**parameters, parameter: wrong},
            {key: value for key, value in parameters.items() if key != parameter},
        ):
            reply = call(served.socket, f"{name}.{method}", bad, **flags)
            assert error_of(reply) == INVALID, (method, bad)
            assert reply is not None and reply["parameters"] == {"parameter": parameter}
        reply = call(served.socket, f"{name}.{method}", {**parameters, "surplus": 1}, **flags)
        assert reply is not None and reply["parameters"] == {"parameter": "surplus"}
        _assert_still_serves(bystander)
    served.assert_healthy()
