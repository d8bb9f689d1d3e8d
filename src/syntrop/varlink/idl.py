"""Render a contract class as Varlink IDL, with a comment on every field.

asyncvarlink renders interfaces too, but without comments on types and
fields; systemd's interfaces document every field, and so do ours. The text
this module produces is what interfaces/*.varlink holds (a test compares them)
and what org.varlink.service.GetInterfaceDescription answers.

Documentation comes from docstrings. The first paragraphs describe the item;
sections name the fields, one per line, continuation lines indented deeper:

    Parameters:           (method parameters, error parameters)
        name: text
    Returns:              (method reply fields)
        name: text
    Fields:               (types)
        name: text
"""

import dataclasses
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterator
from typing import Any

from asyncvarlink import TypedVarlinkErrorReply
from asyncvarlink.conversion import DataclassVarlinkType, VarlinkType

from syntrop.varlink.marks import OPTIONS

_SECTIONS = ("Parameters:", "Returns:", "Fields:")


class IdlError(Exception):
    """A contract cannot be rendered: a field lacks documentation, or a type
    cannot be expressed in Varlink."""


@dataclasses.dataclass(frozen=True, slots=True)
class Doc:
    text: str
    fields: dict[str, str]


def parse_doc(doc: str | None) -> Doc:
    """Split a docstring into its description and its per-field texts."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    fields: dict[str, str] = {}
    current: str | None = None
    in_section = False
    for line in lines:
        if line.strip() in _SECTIONS and not line.startswith(" "):
            in_section = True
            current = None
            continue
        if not in_section:
            description.append(line)
            continue
        if not line.strip():
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if indent <= 4 and ":" in stripped and stripped.split(":", 1)[0].isidentifier():
            current, text = stripped.split(":", 1)
            fields[current] = text.strip()
        elif current is not None:
            fields[current] += " " + stripped
    return Doc("\n".join(description).strip(), fields)


def _comment(text: str, indent: str = "") -> Iterator[str]:
    for paragraph in text.split("\n"):
        if not paragraph.strip():
            yield f"{indent}#"
            continue
        for line in textwrap.wrap(paragraph, width=76 - len(indent)) or [""]:
            yield f"{indent}# {line}"


def _fields(
    items: list[tuple[str, Any, bool]], doc: Doc, where: str, comments: bool
) -> list[str]:
    """Render (name, annotation, optional) as a parenthesised field list."""
    if not items:
        return ["()"]
    out = ["("]
    for index, (name, annotation, optional) in enumerate(items):
        vtype = VarlinkType.from_type_annotation(annotation)
        if optional:
            vtype = vtype.optional()
        if comments:
            text = doc.fields.get(name)
            if not text:
                raise IdlError(f"{where}: field {name!r} is not documented")
            out.extend(_comment(text, "\t"))
        separator = "," if index < len(items) - 1 else ""
        out.append(f"\t{name}: {vtype.as_varlink}{separator}")
    out.append(")")
    return out


def _parameters(raw: Callable[..., Any]) -> list[tuple[str, Any, bool]]:
    signature = inspect.signature(raw)
    items = []
    for name, parameter in list(signature.parameters.items())[1:]:
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise IdlError(f"{raw.__qualname__}: parameter {name} must be keyword-only")
        items.append((name, parameter.annotation, parameter.default is not parameter.empty))
    return items


def _returns(raw: Callable[..., Any], options: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    annotation = inspect.signature(raw).return_annotation
    origin = typing.get_origin(annotation)
    if origin is not None and origin.__name__ in ("AsyncIterator", "Iterator"):
        annotation = typing.get_args(annotation)[0]
    if annotation is None or annotation is inspect.Signature.empty:
        return []
    if options.get("return_parameter"):
        return [(options["return_parameter"], annotation, False)]
    if not typing.is_typeddict(annotation):
        raise IdlError(f"{raw.__qualname__}: return a TypedDict or use return_parameter")
    hints = typing.get_type_hints(annotation)
    return [(name, hints[name], False) for name in annotation.__annotations__]


def _dataclass_fields(cls: type) -> list[tuple[str, Any, bool]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name], False) for f in dataclasses.fields(cls) if f.init]


def _types_in(annotation: Any) -> Iterator[type]:
    """Dataclasses an annotation uses, depth first, outer before inner."""
    for vtype in VarlinkType.from_type_annotation(annotation).traverse():
        if isinstance(vtype, DataclassVarlinkType):
            yield vtype.as_type
            for _, inner, _ in _dataclass_fields(vtype.as_type):
                yield from _types_in(inner)


def render(cls: Any, *, comments: bool = True) -> str:
    """The IDL of a contract class (a syntrop.varlink.contract.Interface)."""
    # The contract's description, not that of a service class deriving from it.
    contract = next(base for base in cls.__mro__ if "name" in vars(base))
    lines: list[str] = []
    if comments:
        lines.extend(_comment(parse_doc(contract.__doc__).text))
    lines.append(f"interface {cls.name}")

    methods = cls.contract_methods()
    errors: list[type[TypedVarlinkErrorReply]] = [
        e for e in cls.errors if e.name.startswith(cls.name + ".")
    ]

    types: dict[str, type] = {}
    for name, raw in methods:
        options = getattr(getattr(cls, name), OPTIONS)
        for _, annotation, _ in _parameters(raw) + _returns(raw, options):
            for dc in _types_in(annotation):
                types.setdefault(dc.__name__, dc)
    for error in errors:
        for annotation in typing.get_type_hints(error.__annotations__["parameters"]).values():
            for dc in _types_in(annotation):
                types.setdefault(dc.__name__, dc)

    for type_name, dc in types.items():
        lines.append("")
        doc = parse_doc(dc.__doc__)
        if comments:
            lines.extend(_comment(doc.text))
        body = _fields(_dataclass_fields(dc), doc, type_name, comments)
        lines.append(f"type {type_name} {body[0]}")
        lines.extend(body[1:])

    for name, raw in methods:
        options = getattr(getattr(cls, name), OPTIONS)
        doc = parse_doc(raw.__doc__)
        lines.append("")
        if comments:
            lines.extend(_comment(doc.text))
        params = _fields(_parameters(raw), doc, f"{cls.name}.{name}", comments)
        result = _fields(_returns(raw, options), doc, f"{cls.name}.{name}", comments)
        if len(params) == 1:
            lines.append(f"method {name}() -> {result[0]}")
        else:
            lines.append(f"method {name}(")
            lines.extend(params[1:-1])
            lines.append(f") -> {result[0]}")
        lines.extend(result[1:])

    for error in errors:
        short = error.name.removeprefix(cls.name + ".")
        doc = parse_doc(error.__doc__)
        hints = typing.get_type_hints(error.__annotations__["parameters"])
        items = [(key, hint, False) for key, hint in hints.items()]
        lines.append("")
        if comments:
            lines.extend(_comment(doc.text))
        body = _fields(items, doc, error.name, comments)
        lines.append(f"error {short} {body[0]}")
        lines.extend(body[1:])
    return "\n".join(lines) + "\n"
