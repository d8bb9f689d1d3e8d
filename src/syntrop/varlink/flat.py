"""Conversion of flat Varlink objects on the server's per-call path.

asyncvarlink converts an object field by field, each inside a context
manager that records where an error happened: about 40 µs per call for
inferenced's AcquireLease parameters, as much as the lease decision itself.
Most of the daemons' parameters and replies are flat: strings, numbers,
booleans, each perhaps optional. For those, `converter()` gives a converter
that checks each field with one isinstance() and nothing else.

It takes only what it can answer exactly as asyncvarlink would. Anything
else (a missing required field, an unknown key, a value of another type,
an int where a float belongs) is handed to asyncvarlink's own conversion,
which raises its error with the location the server reports, or converts.
Types with nested objects, lists, enums or file descriptors are asyncvarlink's
alone.
"""

from collections.abc import Callable
from typing import Any

from asyncvarlink.conversion import (
    ObjectVarlinkType,
    OptionalVarlinkType,
    SimpleVarlinkType,
    VarlinkType,
)

_MISSING = object()
_SIMPLE = {"bool": bool, "int": int, "float": float, "string": str}


class Flat:
    """The fast conversions of one flat ObjectVarlinkType."""

    __slots__ = ("fields", "vtype")

    def __init__(self, vtype: ObjectVarlinkType,
                 fields: tuple[tuple[str, type, bool, bool, bool], ...]) -> None:
        self.vtype = vtype
        #: (key, Python type, optional, populated with None when absent,
        #: left out when None)
        self.fields = fields

    def fromjson(self, obj: Any, oobstate: Any = None) -> Any:
        return self._convert(obj, oobstate, self.vtype.fromjson, parsing=True)

    def tojson(self, obj: Any, oobstate: Any = None) -> Any:
        return self._convert(obj, oobstate, self.vtype.tojson, parsing=False)

    def _convert(self, obj: Any, oobstate: Any, fallback: Callable[[Any, Any], Any], *,
                 parsing: bool) -> Any:
        """Both directions: parsing (fromjson) also fills absent optional
        parameters without a default with None and leaves out a None given
        for one with a default, as asyncvarlink's signatures ask."""
        if type(obj) is not dict:
            return fallback(obj, oobstate)
        result: dict[str, Any] = {}
        present = 0
        for key, kind, optional, populate, discard in self.fields:
            value = obj.get(key, _MISSING)
            if value is _MISSING:
                if not optional:
                    return fallback(obj, oobstate)  # raises
                if populate and parsing:
                    result[key] = None
                continue
            present += 1
            if value is None and optional:
                if not (discard and parsing):
                    result[key] = None
            elif isinstance(value, kind):
                result[key] = value
            else:
                return fallback(obj, oobstate)
        if present != len(obj):  # a key the type does not have
            return fallback(obj, oobstate)
        return result


def _flat(vtype: VarlinkType) -> Flat | None:
    if type(vtype) is not ObjectVarlinkType:
        return None
    fields = []
    for key, field in vtype._typemap.items():
        optional = isinstance(field, OptionalVarlinkType)
        inner = field._vtype if optional else field  # type: ignore[attr-defined]
        kind = _SIMPLE.get(inner.as_varlink) if type(inner) is SimpleVarlinkType else None
        if kind is None or kind is not inner.as_type:
            return None
        fields.append((key, kind, optional, key in vtype._populatenone,
                       key in vtype._discardnone))
    return Flat(vtype, tuple(fields))


_cache: dict[int, tuple[VarlinkType, "Flat | VarlinkType"]] = {}


def converter(vtype: VarlinkType) -> "Flat | VarlinkType":
    """What converts `vtype` fastest: a Flat, or the type itself. Made once
    per type (a method's signature holds its types for the daemon's life)."""
    found = _cache.get(id(vtype))
    if found is not None and found[0] is vtype:
        return found[1]
    made: Flat | VarlinkType = _flat(vtype) or vtype
    _cache[id(vtype)] = (vtype, made)
    return made
