"""What asyncvarlink's conversion takes and a Varlink call must not carry.

sd-varlink refuses these, and so does our server (syntrop.varlink.connection):
a JSON boolean where the contract wants a number, and a string that UTF-8
cannot encode (a lone surrogate, which JSON's escapes can spell).
"""

import re
from typing import Any

from asyncvarlink.conversion import (
    DataclassVarlinkType,
    DictVarlinkType,
    ListVarlinkType,
    ObjectVarlinkType,
    OptionalVarlinkType,
    SimpleVarlinkType,
    VarlinkType,
)

#: A JSON escape of a UTF-16 surrogate: a message without one holds no lone
#: surrogate, and its strings need no further look.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def has_lone_surrogate(value: Any) -> bool:
    """Whether a decoded JSON value holds a string that UTF-8 cannot encode
    (a lone surrogate, which JSON's escapes can spell)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_lone_surrogate(v) for v in value)
    return False


def _stray_boolean(vtype: VarlinkType, value: Any) -> bool:
    """Whether `value` holds a JSON boolean where `vtype` wants a number.

    asyncvarlink converts true/false to int and float (bool is an int in
    Python); sd-varlink refuses them, and so do we. Reads asyncvarlink's
    type objects (pinned version)."""
    if isinstance(vtype, OptionalVarlinkType):
        return value is not None and _stray_boolean(vtype._vtype, value)
    if isinstance(vtype, SimpleVarlinkType):
        return isinstance(value, bool) and vtype.as_varlink in ("int", "float")
    if isinstance(vtype, ListVarlinkType):
        return isinstance(value, list) and any(_stray_boolean(vtype._elttype, v) for v in value)
    if isinstance(vtype, DictVarlinkType):
        return isinstance(value, dict) and any(
            _stray_boolean(vtype._elttype, v) for v in value.values()
        )
    if isinstance(vtype, ObjectVarlinkType | DataclassVarlinkType):
        typemap = vtype._typemap
        return isinstance(value, dict) and any(
            key in typemap and _stray_boolean(typemap[key], v) for key, v in value.items()
        )
    return False


def boolean_as_number(ptype: ObjectVarlinkType, parameters: dict[str, Any]) -> str | None:
    """The first parameter carrying a boolean where a number belongs."""
    typemap = ptype._typemap
    for key, value in parameters.items():
        if key in typemap and _stray_boolean(typemap[key], value):
            return key
    return None
