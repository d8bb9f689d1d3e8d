"""Declaring and implementing contracts."""

import asyncio
from collections.abc import AsyncIterator
from typing import TypedDict, cast

import pytest
from asyncvarlink import AnnotatedResult, TypedVarlinkErrorReply, varlinksignature

from syntrop.varlink.contract import Interface, implements, method
from syntrop.varlink.idl import IdlError, parse_doc


class Pair(TypedDict):
    left: int
    right: str


class Oops(TypedVarlinkErrorReply, interface="io.syntrop.Test1"):
    """Something failed.

    Parameters:
        why: Because.
    """

    class Parameters:
        why: str


class Test1(Interface, name="io.syntrop.Test1"):
    """A test interface."""

    errors = (Oops,)

    @method
    def Split(self, *, value: int, label: str | None = None) -> Pair:  # type: ignore[empty-body]
        """Split a value.

        Parameters:
            value: The value.
            label: A label,
                spanning two lines.

        Returns:
            left: Left part.
            right: Right part.
        """

    @method(return_parameter="item")
    def Count(self, *, upto: int) -> AsyncIterator[int]:  # type: ignore[empty-body]
        """Count.

        Parameters:
            upto: Last number.

        Returns:
            item: A number.
        """


class Service(Test1):
    @implements
    def Split(self, *, value: int, label: str | None = None) -> Pair:
        return {"left": value, "right": label or ""}

    @implements
    async def Count(self, *, upto: int) -> AsyncIterator[int]:
        for i in range(upto):
            yield i


def test_service_renders_exactly_as_its_contract() -> None:
    assert Service.render_interface_description() == Test1.render_interface_description()


def test_rendering_documents_every_field() -> None:
    text = Test1.render_interface_description()
    assert "# A label, spanning two lines.\n\tlabel: ?string" in text
    assert (
        "method Count(\n\t# Last number.\n\tupto: int\n) -> (\n\t# A number.\n\titem: int\n)"
        in text
    )
    assert "error Oops (\n\t# Because.\n\twhy: string\n)" in text


def test_implementation_keeps_contract_signature() -> None:
    signature = varlinksignature(Service.Split)
    assert signature is not None and not signature.asynchronous
    streaming = varlinksignature(Service.Count)
    assert streaming is not None and streaming.more
    # the class wraps an implementation: it answers with a reply, not the bare value
    result = cast(AnnotatedResult, Service().Split(value=3, label="x"))
    assert result.parameters == {"left": 3, "right": "x"}


def test_streaming_implementation_yields() -> None:
    async def collect() -> list[int]:
        replies = cast(AsyncIterator[AnnotatedResult], Service().Count(upto=3))
        return [r.parameters["item"] async for r in replies]

    assert asyncio.run(collect()) == [0, 1, 2]


def test_implements_without_contract_method_is_refused() -> None:
    with pytest.raises(TypeError, match="implements no contract method"):

        class Bad(Test1):
            @implements
            def Missing(self) -> None:
                pass


def test_streaming_implementation_must_be_async_generator() -> None:
    with pytest.raises(TypeError, match="async generator"):

        class Bad(Test1):
            @implements
            def Count(self, *, upto: int) -> AsyncIterator[int]:
                raise NotImplementedError


def test_undocumented_field_is_an_error() -> None:
    class Undocumented(Interface, name="io.syntrop.Undocumented1"):
        """Docs."""

        @method
        def Go(self, *, fast: bool) -> None:
            """Go."""

    with pytest.raises(IdlError, match="fast"):
        Undocumented.render_interface_description()
    assert "fast: bool" in Undocumented.render_interface_description(comments=False)


def test_parse_doc_sections() -> None:
    doc = parse_doc(
        """Summary line.

        More text.

        Parameters:
            a: First.
            b: Second,
                continued.

        Returns:
            c: Third.
        """
    )
    assert doc.text == "Summary line.\n\nMore text."
    assert doc.fields == {"a": "First.", "b": "Second, continued.", "c": "Third."}
