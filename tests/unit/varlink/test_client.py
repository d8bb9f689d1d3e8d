"""The typed client (varlink/client.py) against a small Model1 served here:
replies arrive as the contract's records, declared errors as the contract's
error classes, any other error still by its name; and the typed faces in
interfaces/clients.py are current."""

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from asyncvarlink import GenericVarlinkErrorReply, serviceerrors

from syntrop.interfaces import catalog, clients
from syntrop.interfaces.model import Model, Model1, ModelNotFound
from syntrop.varlink import stubs
from syntrop.varlink.client import connect
from syntrop.varlink.contract import implements
from syntrop.varlink.server import Server

SMOL = Model(name="smol", tag="latest", digest="ab" * 32, size=3, format="gguf",
             architecture="llama", quantization=None, license=None, pinned=False,
             last_access_usec=0, source=None)


class Store(Model1):
    @implements
    def Show(self, *, name: str) -> Model:
        if name != SMOL.name:
            raise ModelNotFound(name=name)
        return SMOL

    @implements
    def Remove(self, *, name: str) -> None:
        raise GenericVarlinkErrorReply("io.example.Elsewhere.Gone", {"name": name})

    @implements
    def Pin(self, *, name: str) -> None:
        raise serviceerrors.InvalidParameter(parameter="name")


def _served(tmp_path: Path,
            scenario: Callable[[clients.Model1Client], Awaitable[None]]) -> None:
    async def main() -> None:
        server = Server([Store()])
        path = tmp_path / "model.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(4)
        server.add_listener(listener)
        try:
            async with await connect(Model1, address=path, timeout=5) as store:
                await scenario(store)
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_reply_arrives_as_the_contracts_record(tmp_path: Path) -> None:
    async def scenario(store: clients.Model1Client) -> None:
        reply = await store.Show(name="smol")
        assert reply["model"] == SMOL and isinstance(reply["model"], Model)

    _served(tmp_path, scenario)


def test_a_declared_error_arrives_as_its_class(tmp_path: Path) -> None:
    async def scenario(store: clients.Model1Client) -> None:
        with pytest.raises(ModelNotFound) as raised:
            await store.Show(name="big")
        assert raised.value.parameters == {"name": "big"}

    _served(tmp_path, scenario)


def test_an_undeclared_error_still_names_itself(tmp_path: Path) -> None:
    async def scenario(store: clients.Model1Client) -> None:
        with pytest.raises(GenericVarlinkErrorReply) as raised:
            await store.Remove(name="smol")
        assert str(raised.value) == "io.example.Elsewhere.Gone: {'name': 'smol'}"

    _served(tmp_path, scenario)


def test_org_varlink_service_errors_arrive_as_their_classes(tmp_path: Path) -> None:
    async def scenario(store: clients.Model1Client) -> None:
        with pytest.raises(serviceerrors.InvalidParameter) as raised:
            await store.Pin(name="smol")
        assert raised.value.parameters == {"parameter": "name"}

    _served(tmp_path, scenario)


def test_the_typed_faces_are_current() -> None:
    """interfaces/clients.py is what `make idl` renders from the contracts."""
    import syntrop.interfaces

    current = Path(syntrop.interfaces.__file__).with_name("clients.py").read_text()
    assert current == stubs.render(catalog.ALL), "run make idl"
