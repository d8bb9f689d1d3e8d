"""The contracts in Python, the files in interfaces/, and the seed agree."""

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from asyncvarlink.serviceinterface import MethodNotImplemented

from syntrop.interfaces.catalog import ALL
from syntrop.varlink.contract import Interface
from tests.unit.varlink.idlshape import members

REPO = Path(__file__).resolve().parents[3]
SEED = Path(__file__).with_name("seed_inference1.varlink")


@pytest.mark.parametrize("contract", ALL, ids=lambda c: c.name)
def test_contract_renders_to_its_file(contract: type[Interface]) -> None:
    path = REPO / "interfaces" / f"{contract.name}.varlink"
    assert path.read_text() == contract.render_interface_description(), (
        f"{path} is stale: run `make idl`"
    )


@pytest.mark.parametrize("contract", ALL, ids=lambda c: c.name)
def test_contract_file_parses_with_independent_parser(contract: type[Interface]) -> None:
    text = (REPO / "interfaces" / f"{contract.name}.varlink").read_text()
    parsed = members(text)
    declared = {name for name, _ in contract.contract_methods()}
    assert {n for n, m in parsed.items() if m[0] == "method"} == declared
    errors = {e.name.rsplit(".", 1)[1] for e in contract.errors}
    assert {n for n, m in parsed.items() if m[0] == "error"} == errors


@pytest.mark.parametrize("contract", ALL, ids=lambda c: c.name)
def test_contract_rendering_without_comments_parses_the_same(contract: type[Interface]) -> None:
    bare = contract.render_interface_description(comments=False)
    assert "#" not in bare
    documented = contract.render_interface_description()
    assert members(bare) == members(documented)


def test_inference1_keeps_every_seed_member_exactly() -> None:
    seed = members(SEED.read_text())
    ours = members((REPO / "interfaces" / "io.syntrop.Inference1.varlink").read_text())
    for name, (kind, first, second) in seed.items():
        assert name in ours, f"seed member {name} missing"
        our_kind, our_first, our_second = ours[name]
        assert our_kind == kind
        if kind == "type":
            # Additions may only be nullable fields after the seed's own.
            assert list(our_first)[: len(first)] == list(first)
            assert {k: our_first[k] for k in first} == first
            assert all(our_first[k].startswith("?") for k in list(our_first)[len(first):])
        elif kind == "method":
            # A method may take more parameters, nullable ones after the
            # seed's (a seed client, which omits them, still calls it);
            # its return parameters stay exactly the seed's.
            assert list(our_first)[: len(first)] == list(first), name
            assert {k: our_first[k] for k in first} == first, name
            assert all(our_first[k].startswith("?") for k in list(our_first)[len(first):]), name
            assert our_second == second, name
        else:
            assert (our_first, our_second) == (first, second), name


@pytest.mark.parametrize("contract", ALL, ids=lambda c: c.name)
def test_unimplemented_methods_answer_method_not_implemented(contract: type[Interface]) -> None:
    service = contract()
    for name, raw in contract.contract_methods():
        params = {
            p: None for p in list(inspect.signature(raw).parameters)[1:]
        }
        method = getattr(service, name)

        async def call(method: Any = method, params: dict[str, None] = params) -> None:
            if method._varlink_signature.more:
                async for _ in method(**params):
                    pass
            else:
                await method(**params)

        with pytest.raises(MethodNotImplemented) as caught:
            asyncio.run(call())
        assert caught.value.parameters == {"method": name}
