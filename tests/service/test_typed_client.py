"""Our typed client (syntrop.varlink.client) against real daemons, and its
timeout against a socket that never answers."""

import asyncio
import socket
import time
from pathlib import Path

import pytest

from syntrop.cli.launcher import Daemon
from syntrop.varlink.client import CallTimeout, connect
from syntrop.varlink.contract import Interface
from tests.service.wire import (
    Running,
    service_class,
)


def _contract(daemon: Daemon) -> type[Interface]:
    """The contract class a client of `daemon` would use."""
    service = service_class(daemon)
    return next(
        base
        for base in service.__mro__[1:]
        if issubclass(base, Interface) and base.name == daemon.interface
    )


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
