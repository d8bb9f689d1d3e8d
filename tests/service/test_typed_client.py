"""Our typed client (syntrop.varlink.client) against real daemons, and its
timeout against a socket that never answers."""

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.cli.launcher import DAEMONS, Daemon
from syntrop.varlink.client import CallTimeout, connect
from syntrop.varlink.contract import Interface
from tests.service.wire import (
    Running,
    idl,
    service_class,
    skip_implemented,
    streaming,
    unimplemented,
    valid_parameters,
)


def _contract(daemon: Daemon) -> type[Interface]:
    """The contract class a client of `daemon` would use."""
    service = service_class(daemon)
    return next(
        base
        for base in service.__mro__[1:]
        if issubclass(base, Interface) and base.name == daemon.interface
    )


def _plain_unimplemented(daemon: Daemon, *, stream: bool) -> tuple[str, dict[str, Any]]:
    """An unimplemented method whose valid parameters need no records
    (the typed client wants dataclasses where the IDL has structs)."""
    interface = idl(daemon)
    for name in unimplemented(daemon):
        if (name in streaming(daemon)) != stream:
            continue
        parameters = valid_parameters(interface, name)
        if not any(isinstance(value, dict) for value in parameters.values()):
            return name, parameters
    skip_implemented(daemon, stream=stream)


def _assert_not_implemented(error: BaseException, name: str) -> None:
    assert isinstance(error, VarlinkErrorReply), repr(error)
    assert error.name == "org.varlink.service.MethodNotImplemented"


def test_typed_client_unimplemented_raises_method_not_implemented(served: Running) -> None:
    name, parameters = _plain_unimplemented(served.daemon, stream=False)

    async def scenario() -> BaseException:
        async with await connect(
            _contract(served.daemon), address=served.socket, timeout=10
        ) as client:
            with pytest.raises(VarlinkErrorReply) as raised:
                await getattr(client, name)(**parameters)
            return raised.value

    _assert_not_implemented(asyncio.run(scenario()), name)
    served.assert_healthy()


@pytest.mark.parametrize(
    "served", [d for d in DAEMONS if streaming(d)], indirect=True, ids=lambda daemon: daemon.program
)
def test_typed_client_unimplemented_stream_raises(served: Running) -> None:
    name, parameters = _plain_unimplemented(served.daemon, stream=True)

    async def scenario() -> BaseException:
        async with await connect(
            _contract(served.daemon), address=served.address, timeout=10
        ) as client:
            with pytest.raises(VarlinkErrorReply) as raised:
                async for _ in getattr(client, name)(**parameters):
                    pass
            return raised.value

    _assert_not_implemented(asyncio.run(scenario()), name)


def test_typed_client_unknown_method_is_an_attribute_error(served: Running) -> None:
    async def scenario() -> None:
        async with await connect(_contract(served.daemon), address=served.address) as client:
            with pytest.raises(AttributeError):
                client.NoSuchMethod  # noqa: B018

    asyncio.run(scenario())


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_typed_client_times_out_on_a_silent_server(tmp_path: Path, stream: bool) -> None:
    from syntrop.interfaces.inference import Inference1

    path = tmp_path / "silent"
    timeout = 0.3
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(path))
        silent.listen(4)  # connects complete in the backlog; nobody ever answers

        async def scenario() -> float:
            client = await connect(Inference1, address=path, timeout=timeout)
            try:
                started = time.monotonic()
                with pytest.raises(CallTimeout):
                    if stream:
                        async for _ in client.StreamInference(model="m", prompt="p"):
                            pass
                    else:
                        await client.ListLeases()
                return time.monotonic() - started
            finally:
                client.close()
                await asyncio.sleep(0)

        elapsed = asyncio.run(scenario())
    assert timeout <= elapsed < timeout + 1.5, elapsed


def test_typed_client_connect_to_nothing_fails_fast(tmp_path: Path) -> None:
    from syntrop.interfaces.inference import Inference1

    async def scenario() -> None:
        with pytest.raises(OSError):
            await connect(Inference1, address=tmp_path / "nothing-here", timeout=5)

    started = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - started < 2
