"""What every tool is: a typed parameter schema, a prepare step (checks and
the plan; all a dry run does), and an execute step.

A tool never builds a shell string. Its parameters are validated against
its schema before anything else happens: unknown names, missing required
ones, wrong types (a bool is not an int), patterns, choices and ranges are
each an InvalidArgument naming the parameter.
"""

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from syntrop.toold import errors, units

if TYPE_CHECKING:
    from syntrop.toold.context import Context


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    name: str
    type: type  # str, int or bool
    description: str
    required: bool = False
    pattern: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    #: Extra check of a string: returns why it is wrong, or None.
    check: Callable[[str], str | None] | None = None


UNIT = Param(name="unit", type=str, required=True, pattern=units.PATTERN,
             check=units.syntax_error,
             description="The unit, e.g. nginx.service (no paths, no '..').")


@dataclass(slots=True, kw_only=True)
class Plan:
    """What prepare found: the steps in words (a dry run's answer) and what
    execute needs."""

    steps: list[str]
    unit: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    #: Whether execute starts sandboxed tool processes.
    sandboxed: bool = False


@dataclass(slots=True, kw_only=True)
class Outcome:
    outcome: str  # succeeded, failed, rolled_back
    message: str
    rolled_back: bool = False
    sandbox: list[str] = field(default_factory=list)
    job_result: str | None = None
    active_state: str | None = None
    previous_active_state: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Tool(ABC):
    """A tool; subclasses set the class attributes and the two steps."""

    name: ClassVar[str]
    description: ClassVar[str]
    risk: ClassVar[str]  # safe, remediation, maintenance
    reversible: ClassVar[bool]
    rollback: ClassVar[str]
    sandboxed: ClassVar[bool]
    parameters: ClassVar[tuple[Param, ...]] = ()

    def validate(self, raw: Any) -> dict[str, Any]:
        """The parameters, checked against the schema; raises BadArgument."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise errors.BadArgument("parameters must be an object", tool=self.name,
                                     parameter="parameters", reason="not an object")
        known = {p.name: p for p in self.parameters}
        for key in raw:
            if key not in known:
                raise self._bad(str(key)[:128], "unknown parameter")
        values: dict[str, Any] = {}
        for param in self.parameters:
            value = raw.get(param.name)
            if value is None:
                if param.required:
                    raise self._bad(param.name, "required")
                continue
            values[param.name] = self._check(param, value)
        return values

    def _bad(self, parameter: str, reason: str) -> errors.BadArgument:
        return errors.BadArgument(f"{self.name}: {parameter}: {reason}", tool=self.name,
                                  parameter=parameter, reason=reason)

    def _check(self, param: Param, value: Any) -> Any:
        expected = param.type
        if isinstance(value, bool) and expected is not bool:
            raise self._bad(param.name, f"must be {expected.__name__}, not bool")
        if not isinstance(value, expected):
            raise self._bad(param.name, f"must be {expected.__name__}")
        if isinstance(value, str):
            if len(value) > 1024 or "\0" in value:
                raise self._bad(param.name, "too long or contains NUL")
            if param.pattern is not None and re.fullmatch(param.pattern, value) is None:
                raise self._bad(param.name, "does not match its pattern")
            if param.choices is not None and value not in param.choices:
                raise self._bad(param.name, f"must be one of {', '.join(param.choices)}")
            if param.check is not None:
                why = param.check(value)
                if why is not None:
                    raise self._bad(param.name, why)
        if isinstance(value, int) and not isinstance(value, bool):
            if param.minimum is not None and value < param.minimum:
                raise self._bad(param.name, f"must be at least {param.minimum}")
            if param.maximum is not None and value > param.maximum:
                raise self._bad(param.name, f"must be at most {param.maximum}")
        return value

    @abstractmethod
    async def prepare(self, args: dict[str, Any], ctx: "Context") -> Plan:
        """Check everything that can be checked without changing anything
        (raising a ToolError), and say what execute would do."""

    @abstractmethod
    async def execute(self, plan: Plan, ctx: "Context") -> Outcome:
        """Do it. Failures after something changed are an Outcome, not an
        exception."""

