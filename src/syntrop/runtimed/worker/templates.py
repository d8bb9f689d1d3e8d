"""A chat template sandbox with bounded operators.

A GGUF's chat template is attacker text. Jinja's sandbox keeps it from
Python's internals and bounds range(), but its operators are Python's: `'a'
* 10**10` asks for 10 GB, `9 ** 10**9` for hours of arithmetic. Here `*`,
`+`, `**` and `%` are checked before they run, on what they would make, and
refused with a SecurityError (a TemplateError, which the engine answers as
the model's fault) when it would pass MAX_ITEMS characters or items, or
MAX_BITS bits for an integer.
"""

import re
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

#: The most characters (or list items) one operation may make: a chat
#: prompt is far smaller.
MAX_ITEMS = 1 << 20
#: The most bits an integer an operation makes may have.
MAX_BITS = 1 << 12

_SIZED = (str, bytes, list, tuple)
#: A printf-style conversion's width and precision.
_CONVERSION = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(operator: str, what: str) -> SecurityError:
    return SecurityError(f"the template's {operator!r} would make {what}")


def _check(operator: str, left: Any, right: Any) -> None:
    """Raise SecurityError if `left operator right` would be too large."""
    if operator == "*":
        for sized, count in ((left, right), (right, left)):
            if isinstance(sized, _SIZED) and _int(count) and len(sized) * count > MAX_ITEMS:
                raise _refuse(operator, f"more than {MAX_ITEMS} items")
        if _int(left) and _int(right) and left.bit_length() + right.bit_length() > MAX_BITS:
            raise _refuse(operator, f"an integer over {MAX_BITS} bits")
    elif operator == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED) \
                and len(left) + len(right) > MAX_ITEMS:
            raise _refuse(operator, f"more than {MAX_ITEMS} items")
    elif operator == "**":
        if _int(left) and _int(right) and abs(left) > 1 \
                and left.bit_length() * right > MAX_BITS:
            raise _refuse(operator, f"an integer over {MAX_BITS} bits")
    elif operator == "%" and isinstance(left, str):
        for match in _CONVERSION.finditer(left):
            for size in match.groups():
                if size == "*" or (size is not None and int(size) > MAX_ITEMS):
                    raise _refuse(operator, f"a field wider than {MAX_ITEMS}")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with `*`, `+`, `**` and `%` checked (and so
    never folded at compile time)."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _check(operator, left, right)
        return super().call_binop(context, operator, left, right)


class ChatFormatter(Jinja2ChatFormatter):
    """The library's formatter, its template compiled in a BoundedSandbox
    configured as the library configures its own (extensions, filters)."""

    def __init__(self, *, template: str, **kwargs: Any) -> None:
        # Built on an empty template: the library's environment would fold
        # the template's constant expressions, `'a' * 10**10` among them,
        # while compiling it.
        super().__init__(template="", **kwargs)
        stock = self._environment.environment
        bounded = BoundedSandbox(
            loader=stock.loader, trim_blocks=stock.trim_blocks, lstrip_blocks=stock.lstrip_blocks,
            extensions=[type(extension) for extension in stock.extensions.values()],
        )
        bounded.filters.update(stock.filters)
        self.template = template
        self._environment = bounded.from_string(template)
