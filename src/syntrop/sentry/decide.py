"""The model's decision, as pure functions: which tools the evidence allows,
the prompt, and the strict reading of the answer.

Design note: a small model (SmolLM2-135M) follows a format it has just seen
far better than one described in words, so the prompt is a fixed system
line, worked examples as earlier chat turns (those offering the same tools:
a model this small copies the nearest example's shape, and the examples are
constant per offer so the engine can reuse their evaluation), then the
failure: the unit, the evidence one
line each (times relative to the failure) and the offered tools as
signatures built from toold's declared parameters. Only the actions the
evidence allows are offered: revert_dropin only when a drop-in of the unit
changed shortly before the failure; unit_restart; none. The answer must be
exactly one JSON object {"tool", "parameters"} naming an offered tool, with
parameters that pass the tool's declared types, patterns, choices and
bounds, and `unit` (when the tool has it) must be the failed unit: anything
else is rejected and the rules decide. `answer_schema()` is the same
contract as a JSON schema, for a decoding constraint.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

from syntrop.sentry.rules import NONE, Change, Decision, recent_dropin

#: Decoding: greedy and short. An answer is about 30 tokens.
MAX_TOKENS = 48
TEMPERATURE = 0.0
SEED = 7
#: Lines of evidence and of journal given to the model.
MAX_EVIDENCE = 8
MAX_JOURNAL = 3

SYSTEM = ("You are systemd-sentry. A systemd unit failed. Pick one of the offered tools "
          'and answer with one JSON object: {"tool": NAME, "parameters": {...}}.')
EXAMPLES: tuple[tuple[str, str], ...] = (
    ("unit: web.service\n"
     "evidence: drop-in override.conf (persistent) changed 4 s before the failure\n"
     "tools: revert_dropin(unit, scope: persistent|runtime); unit_restart(unit); none()",
     '{"tool": "revert_dropin", "parameters": {"unit": "web.service", "scope": "persistent"}}'),
    ("unit: db.service\n"
     "evidence: no file changed before the failure; journal: db.service: Main process "
     "exited, code=exited, status=1/FAILURE\n"
     "tools: unit_restart(unit); none()",
     '{"tool": "unit_restart", "parameters": {"unit": "db.service"}}'),
    ("unit: api.service\n"
     "evidence: drop-in 10-env.conf (runtime) changed 9 s before the failure\n"
     "tools: revert_dropin(unit, scope: persistent|runtime); unit_restart(unit); none()",
     '{"tool": "revert_dropin", "parameters": {"unit": "api.service", "scope": "runtime"}}'),
    ("unit: mail.service\n"
     "evidence: dpkg upgrade exim4 4.96 → 4.97 (30 s before the failure); config "
     "/etc/exim4/exim4.conf modified 30 s before the failure\n"
     "tools: unit_restart(unit); none()",
     '{"tool": "unit_restart", "parameters": {"unit": "mail.service"}}'),
)

#: Parameter types as toold names them (its contract says "string"; it sends
#: the Python name "str").
_TYPES: dict[str, type] = {"string": str, "str": str, "int": int, "bool": bool}
_JSON_TYPES = {"string": "string", "str": "string", "int": "integer", "bool": "boolean"}


class AnswerError(ValueError):
    """The model's answer is not an acceptable tool call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """A tool parameter as toold declares it (Tool1.ToolParameter)."""

    name: str
    type: str
    required: bool = False
    pattern: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """A tool offered to the model."""

    name: str
    description: str = ""
    parameters: tuple[Param, ...] = ()


NONE_SPEC = Spec(name=NONE, description="do nothing")


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What the model is told about the failure."""

    unit: str
    failure_usec: int
    changes: list[Change] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)


def _get(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def specs(tools: list[Any]) -> dict[str, Spec]:
    """Tool1.ListTools' answer (records or dicts) as specs by name."""
    found: dict[str, Spec] = {}
    for tool in tools:
        params = tuple(
            Param(name=str(_get(p, "name")), type=str(_get(p, "type")),
                  required=bool(_get(p, "required")), pattern=_get(p, "pattern"),
                  choices=tuple(_get(p, "choices")) if _get(p, "choices") else None,
                  minimum=_get(p, "minimum"), maximum=_get(p, "maximum"))
            for p in _get(tool, "parameters") or [])
        name = str(_get(tool, "name"))
        found[name] = Spec(name=name, description=str(_get(tool, "description") or ""),
                           parameters=params)
    return found


def offers(evidence: Evidence, known: dict[str, Spec], recent_usec: int) -> list[Spec]:
    """The tools the evidence allows, most specific first, `none` last."""
    offered: list[Spec] = []
    if "revert_dropin" in known and recent_dropin(
            evidence.unit, evidence.changes, evidence.failure_usec, recent_usec) is not None:
        offered.append(known["revert_dropin"])
    if "unit_restart" in known:
        offered.append(known["unit_restart"])
    offered.append(NONE_SPEC)
    return offered


def signature(spec: Spec) -> str:
    """`revert_dropin(unit, scope: persistent|runtime)`: the required
    parameters and those limited to choices (optional ones stay unsaid)."""
    parts = []
    for param in spec.parameters:
        if param.choices:
            parts.append(f"{param.name}: {'|'.join(param.choices)}")
        elif param.required:
            parts.append(param.name)
    return f"{spec.name}({', '.join(parts)})"


def _ago(change_usec: int, failure_usec: int) -> str:
    seconds = (failure_usec - change_usec) / 1e6
    if seconds < 0:
        return f"{-seconds:.0f} s after the failure"
    return f"{seconds:.0f} s before the failure"


def evidence_lines(evidence: Evidence) -> list[str]:
    """One line per change, newest first, then the last journal lines."""
    lines: list[str] = []
    for change in sorted(evidence.changes, key=lambda c: c.timestamp_usec, reverse=True):
        when = _ago(change.timestamp_usec, evidence.failure_usec)
        if change.kind == "dropin":
            scope = "runtime" if (change.path or "").startswith("/run/") else "persistent"
            name = (change.path or "?").rsplit("/", 1)[-1]
            lines.append(f"drop-in {name} ({scope}) changed {when}")
        elif change.kind == "package":
            what = change.summary or f"package {change.package} {change.action}"
            lines.append(f"{what} ({when})")
        elif change.kind in ("config", "unit_file"):
            kind = change.kind.replace("_", " ")
            lines.append(f"{kind} {change.path} {change.action or 'changed'} {when}")
        else:
            lines.append(f"{change.summary or change.kind} ({when})")
        if len(lines) >= MAX_EVIDENCE:
            break
    if not any(c.kind in ("dropin", "config", "unit_file", "package") for c in evidence.changes):
        lines.append("no file changed before the failure")
    lines.extend(f"journal: {line[:160]}" for line in evidence.journal[-MAX_JOURNAL:])
    return lines


def messages(evidence: Evidence, offered: list[Spec]) -> list[tuple[str, str]]:
    """(role, content) pairs: system, the worked examples offering the same
    tools (all of them when none does), the failure."""
    tools = f"tools: {'; '.join(signature(s) for s in offered)}"
    examples = [e for e in EXAMPLES if e[0].endswith("\n" + tools)] or list(EXAMPLES)
    chat: list[tuple[str, str]] = [("system", SYSTEM)]
    for question, answer in examples:
        chat += [("user", question), ("assistant", answer)]
    chat.append(("user", f"unit: {evidence.unit}\n"
                         f"evidence: {'; '.join(evidence_lines(evidence))}\n{tools}"))
    return chat


def answer_schema(offered: list[Spec], unit: str | None = None) -> dict[str, Any]:
    """The accepted answers as a JSON schema (one branch per offered tool);
    with `unit`, a `unit` parameter can only be that unit. Optional
    parameters without a fixed set of choices (timeouts, health windows) are
    left to the tool's defaults: a small model picks numbers badly."""
    branches = []
    for spec in offered:
        properties: dict[str, Any] = {}
        for param in spec.parameters:
            if not param.required and not param.choices:
                continue
            if param.name == "unit" and unit is not None:
                properties[param.name] = {"const": unit}
                continue
            prop: dict[str, Any] = {"type": _JSON_TYPES.get(param.type, "string")}
            if param.choices:
                prop["enum"] = list(param.choices)
            if param.pattern:
                prop["pattern"] = param.pattern
            if param.minimum is not None:
                prop["minimum"] = param.minimum
            if param.maximum is not None:
                prop["maximum"] = param.maximum
            properties[param.name] = prop
        branches.append({
            "type": "object", "additionalProperties": False, "required": ["tool", "parameters"],
            "properties": {
                "tool": {"const": spec.name},
                "parameters": {"type": "object", "additionalProperties": False,
                               "properties": properties,
                               "required": [p.name for p in spec.parameters if p.required]}}})
    return {"oneOf": branches}


def _check(spec: Spec, param: Param, value: Any, unit: str) -> None:
    expected = _TYPES.get(param.type)
    if expected is None:
        raise AnswerError(f"{spec.name}.{param.name} has an unknown type {param.type!r}")
    if type(value) is not expected:  # bool is not an int here
        raise AnswerError(f"{spec.name}.{param.name} must be {param.type}")
    if isinstance(value, str):
        if param.pattern is not None and re.fullmatch(param.pattern, value) is None:
            raise AnswerError(f"{spec.name}.{param.name} does not match its pattern")
        if param.choices and value not in param.choices:
            raise AnswerError(f"{spec.name}.{param.name} must be one of {list(param.choices)}")
        if param.name == "unit" and value != unit:
            raise AnswerError(f"{spec.name}.unit must be the failed unit {unit}, not {value}")
    if isinstance(value, int) and not isinstance(value, bool):
        if param.minimum is not None and value < param.minimum:
            raise AnswerError(f"{spec.name}.{param.name} is below {param.minimum}")
        if param.maximum is not None and value > param.maximum:
            raise AnswerError(f"{spec.name}.{param.name} is above {param.maximum}")


def parse(text: str, offered: list[Spec], unit: str) -> Decision:
    """The answer as a Decision (tool `none` for no action). Strict: one JSON
    object and nothing else, keys exactly tool and parameters, an offered
    tool, declared parameters only, each valid, the required ones present."""
    try:
        value: Any = json.loads(text.strip())
    except ValueError:
        raise AnswerError("not one JSON object") from None
    if not isinstance(value, dict) or set(value) != {"tool", "parameters"}:
        raise AnswerError('not an object with exactly "tool" and "parameters"')
    tool, parameters = value["tool"], value["parameters"]
    by_name = {s.name: s for s in offered}
    if not isinstance(tool, str) or tool not in by_name:
        raise AnswerError(f"tool {tool!r} was not offered")
    if not isinstance(parameters, dict):
        raise AnswerError("parameters is not an object")
    spec = by_name[tool]
    declared = {p.name: p for p in spec.parameters}
    for name, item in parameters.items():
        if name not in declared:
            raise AnswerError(f"{tool} has no parameter {name!r}")
        _check(spec, declared[name], item, unit)
    missing = [p.name for p in spec.parameters if p.required and p.name not in parameters]
    if missing:
        raise AnswerError(f"{tool} is missing {', '.join(missing)}")
    return Decision(tool=tool, parameters=dict(parameters), reason="model")


def summarise(text: str, limit: int = 160) -> str:
    """The raw answer for the incident, on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"
