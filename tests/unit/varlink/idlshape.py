"""Structural view of a .varlink file through python-varlink's parser: an
independent reading of our contracts."""

from typing import Any

import varlink
from varlink import scanner


def shape(vtype: Any) -> str:
    """A canonical spelling of a parsed Varlink type."""
    if isinstance(vtype, scanner._Maybe):
        return "?" + shape(vtype.element_type)
    if isinstance(vtype, scanner._Array):
        return "[]" + shape(vtype.element_type)
    if isinstance(vtype, scanner._Dict):
        return "[string]" + shape(vtype.element_type)
    if isinstance(vtype, scanner._CustomType):
        name: str = vtype.name
        return name
    if isinstance(vtype, scanner._Object):
        return "object"
    if isinstance(vtype, scanner._Enum):
        return "(" + ", ".join(vtype.fields) + ")"
    if isinstance(vtype, scanner._Struct):
        return "(" + ", ".join(f"{k}: {shape(v)}" for k, v in vtype.fields.items()) + ")"
    # Primitive types are represented by a default value.
    if isinstance(vtype, bool):
        return "bool"
    if isinstance(vtype, int):
        return "int"
    if isinstance(vtype, float):
        return "float"
    if isinstance(vtype, str):
        return "string"
    raise TypeError(f"unknown parsed type {vtype!r}")


def members(text: str) -> dict[str, tuple[str, dict[str, str], dict[str, str]]]:
    """name -> (kind, fields or in-fields, out-fields) of every member."""
    interface = varlink.Interface(text)
    out: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {}
    for name, member in interface.members.items():
        if isinstance(member, scanner._Method):
            out[name] = (
                "method",
                {k: shape(v) for k, v in member.in_type.fields.items()},
                {k: shape(v) for k, v in member.out_type.fields.items()},
            )
        elif isinstance(member, scanner._Error):
            fields = member.type.fields if isinstance(member.type, scanner._Struct) else {}
            out[name] = ("error", {k: shape(v) for k, v in fields.items()}, {})
        else:
            out[name] = ("type", {k: shape(v) for k, v in member.type.fields.items()}, {})
    return out
