"""Declaring a Varlink interface once, in Python, and implementing it apart.

A contract is a class deriving from `Interface` whose methods are declared
with `@method`: keyword-only typed parameters, a return annotation, and a
docstring whose sections document every field:

    class Inference1(Interface, name="io.syntrop.Inference1"):
        '''Compute planes and leases.'''

        @method
        def ReleaseLease(self, *, lease_id: str) -> None:
            '''Give a lease back.

            Parameters:
                lease_id: The lease, as AcquireLease returned it.
            '''

The contract is what clients use (asyncvarlink proxies need only the
signatures) and what interfaces/*.varlink is rendered from. Until a daemon
implements a method, calling it answers org.varlink.service.MethodNotImplemented.

A daemon's service class derives from the contract and marks its
implementations with `@implements`; the signature and documentation are taken
from the contract, so the face cannot drift from the file in interfaces/.
"""

import collections.abc
import inspect
import typing
from collections.abc import Callable
from typing import Any

from asyncvarlink import TypedVarlinkErrorReply, VarlinkInterface, varlinkmethod
from asyncvarlink.serviceinterface import MethodNotImplemented

from syntrop.varlink.marks import OPTIONS

_CONTRACT = "_syntrop_contract"
_IMPLEMENTS = "_syntrop_implements"


def _is_stream(annotation: object) -> bool:
    origin = typing.get_origin(annotation)
    return origin is not None and isinstance(origin, type) and issubclass(
        origin, collections.abc.AsyncIterator
    )


@typing.overload
def method(function: Callable[..., Any], /) -> Any: ...


@typing.overload
def method(
    *, return_parameter: str | None = None, allow_foreign: bool = False
) -> Callable[[Callable[..., Any]], Any]: ...


def method(
    function: Callable[..., Any] | None = None,
    *,
    return_parameter: str | None = None,
    allow_foreign: bool = False,
) -> Any:
    """Declare a contract method. The body is never run.

    A return annotation of AsyncIterator[X] makes a streaming method (the
    caller must set "more"). `return_parameter` wraps a bare return value in
    a one-field reply, as in asyncvarlink. `allow_foreign` permits `object`.
    """

    def declare(raw: Callable[..., Any]) -> Any:
        name = raw.__name__
        signature = inspect.signature(raw)
        if _is_stream(signature.return_annotation):

            async def stub_stream(self: Any, **_: Any) -> Any:
                raise MethodNotImplemented(method=name)
                yield  # pragma: no cover - makes this an async generator

            stub: Callable[..., Any] = stub_stream
        else:

            async def stub_call(self: Any, **_: Any) -> Any:
                raise MethodNotImplemented(method=name)

            stub = stub_call
        options = {"return_parameter": return_parameter, "allow_foreign": allow_foreign}
        return _wrap(stub, raw, options)

    if function is None:
        return declare
    return declare(function)


def _wrap(
    implementation: Callable[..., Any], raw: Callable[..., Any], options: dict[str, Any]
) -> Any:
    """Give `implementation` the contract's name, signature and documentation."""
    implementation.__name__ = raw.__name__
    implementation.__qualname__ = raw.__qualname__
    implementation.__doc__ = raw.__doc__
    implementation.__signature__ = inspect.signature(raw)  # type: ignore[attr-defined]
    wrapped = varlinkmethod(implementation, **options)
    setattr(wrapped, _CONTRACT, raw)
    setattr(wrapped, OPTIONS, options)
    return wrapped


_F = typing.TypeVar("_F", bound=Callable[..., Any])


def implements(function: _F) -> _F:
    """Mark a service method as the implementation of the contract method of
    the same name. Sync or async both work; a streaming method must be an
    async generator."""
    setattr(function, _IMPLEMENTS, True)
    return function


def contract_of(function: object) -> Callable[..., Any] | None:
    """The raw contract declaration behind a Varlink method, if any."""
    return typing.cast(Callable[..., Any] | None, getattr(function, _CONTRACT, None))


def internal_error(interface: str) -> type[TypedVarlinkErrorReply]:
    """The `InternalError` every contract declares last: what the server
    answers when a method fails in a way it did not foresee, so that even
    then the caller gets an error its interface names."""

    class InternalError(TypedVarlinkErrorReply, interface=interface):
        """The daemon failed in a way it did not foresee; its journal says
        where and why.

        Parameters:
            method: The method that failed.
        """

        class Parameters:
            method: str

    return InternalError


class Interface(VarlinkInterface, name="io.syntrop.Interface"):
    """Base of every syntrop contract and service class."""

    #: Declared errors of this interface, rendered into the IDL in this order.
    errors: collections.abc.Sequence[type[TypedVarlinkErrorReply]] = ()

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        if name is not None:
            cls.name = name
            cls.errors = (*cls.errors, internal_error(name))
        super().__init_subclass__(**kwargs)
        for attribute, value in list(vars(cls).items()):
            if not getattr(value, _IMPLEMENTS, False):
                continue
            declared = None
            for base in cls.__mro__[1:]:
                candidate = vars(base).get(attribute)
                if candidate is not None and contract_of(candidate) is not None:
                    declared = candidate
                    break
            if declared is None:
                raise TypeError(f"{cls.__name__}.{attribute} implements no contract method")
            raw = contract_of(declared)
            assert raw is not None
            if _is_stream(inspect.signature(raw).return_annotation) and not (
                inspect.isasyncgenfunction(value)
            ):
                raise TypeError(f"{cls.__name__}.{attribute} must be an async generator")
            setattr(cls, attribute, _wrap(value, raw, getattr(declared, OPTIONS)))

    @classmethod
    def contract_methods(cls) -> list[tuple[str, Callable[..., Any]]]:
        """(name, raw declaration) of every method, in declaration order."""
        seen: dict[str, Callable[..., Any]] = {}
        for base in reversed(cls.__mro__):
            for attribute, value in vars(base).items():
                raw = contract_of(value)
                if raw is not None and attribute not in seen:
                    seen[attribute] = raw
        return list(seen.items())

    @classmethod
    def render_interface_description(cls, *, comments: bool = True) -> str:
        from syntrop.varlink.idl import render  # only when introspected

        return render(cls, comments=comments)

