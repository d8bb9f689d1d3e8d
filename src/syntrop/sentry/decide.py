"""The model's plan, as pure functions: the prompt, the accepted answers as
a JSON schema, and the strict reading of the answer.

The model sees what the rules see: the unit, the findings one line each
(times relative to the failure, unlinked changes marked so), the cause the
rules named, and the plans it may choose from (findings.candidates: the
rules' plan, the plans of the other linked findings, nothing). Each
plan is written out as the tool calls it makes, with toold's declared
parameters. The answer must be exactly one JSON object {"plan": [steps]}
equal to one of the offered plans: anything else is rejected and the rules'
plan stands. `answer_schema()` is that contract as a JSON schema, for a
decoding constraint, so a constrained answer always parses.

Design note: a small model (SmolLM2-135M) follows a format it has just seen
far better than one described in words, and copies the nearest example: so
the prompt is a fixed system line, worked examples as earlier chat turns,
the one closest to this offer last (the same for the same kind of offer,
so the engine reuses their evaluation from one triage to the next), then
the failure, all in the compact JSON the constrained answer is written in.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from syntrop.sentry.findings import Plan

#: Decoding: greedy and short. A two-step plan is about 45 tokens.
MAX_TOKENS = 96
TEMPERATURE = 0.0
SEED = 7
#: Lines of findings and of journal given to the model.
MAX_FINDINGS = 8
MAX_JOURNAL = 3
#: systemd's own lines about the job and the main process: the findings say
#: the same (exit status, the failure), and measured, they pull SmolLM2
#: towards a plain restart (bench_sentry --plans: a bad drop-in on a new
#: unit, 0/3 with them, 3/3 without). The unit's own lines stay.
SYSTEMD_LINES = re.compile(
    r"\b(Starting|Started|Stopping|Stopped|Deactivated successfully|Consumed|Main process "
    r"exited|Failed with result|Failed to start|Scheduled restart job|Start request repeated)\b")

SYSTEM = ("You are systemd-sentry. A systemd unit failed. Choose one of the offered plans "
          'and answer with one JSON object: {"plan": [STEP, ...]}, each STEP '
          '{"tool": NAME, "parameters": {...}}; the empty plan does nothing.')
def _compact(value: Any) -> str:
    """JSON as the constrained decoder writes it (no spaces): the examples,
    the offered plans and the answer all look alike, which a small model
    copies best."""
    return json.dumps(value, separators=(",", ":"))


def _example(unit: str, findings: str, cause: str, plans: list[list[dict[str, Any]]],
             answer: int) -> tuple[str, str]:
    listed = "\n".join(f"{n}. {_compact(plan)}" for n, plan in enumerate(plans, 1))
    return (f"unit: {unit}\nfindings: {findings}\ncause: {cause}\nplans:\n{listed}",
            _compact({"plan": plans[answer]}))


def _restart(unit: str) -> list[dict[str, Any]]:
    return [{"tool": "unit_restart", "parameters": {"unit": unit}}]


EXAMPLES: tuple[tuple[str, str], ...] = (
    _example("web.service",
             "main process exited with status 1; drop-in /etc/systemd/system/web.service.d/"
             "override.conf changed 4 s before the failure",
             "drop-in /etc/systemd/system/web.service.d/override.conf changed 4 s before the "
             "failure",
             [[{"tool": "revert_dropin", "parameters": {"unit": "web.service",
                                                        "scope": "persistent"}}], []], 0),
    _example("api.service",
             "systemd runs an old definition (the unit file changed on disk); program "
             "/usr/bin/api-old is missing",
             "systemd runs an old definition (the unit file changed on disk)",
             [[{"tool": "daemon_reload", "parameters": {}}, *_restart("api.service")], []], 0),
    _example("db.service",
             "main process exited with status 1; drop-in /etc/systemd/system/db.service.d/"
             "10-log.conf changed 900 s before the failure (not linked to it)",
             "no change explains it (main process exited with status 1)",
             [_restart("db.service"), []], 0),
    _example("cache.service",
             "the journal names the cache /var/cache/cache-web; main process exited with "
             "status 1",
             "the journal names the cache /var/cache/cache-web",
             [[{"tool": "clear_cache", "parameters": {"unit": "cache.service"}},
               *_restart("cache.service")], []], 0),
)


class AnswerError(ValueError):
    """The model's answer is not one of the offered plans."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What the model is told about the failure."""

    unit: str
    findings: list[str]
    cause: str
    journal: list[str]


def _get(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def tool_names(tools: list[Any]) -> list[str]:
    """The names in Tool1.ListTools' answer (records or dicts)."""
    return [str(_get(tool, "name")) for tool in tools]


def plan_text(plan: Plan) -> str:
    return _compact(plan.wire())


def _closeness(example: tuple[str, str], offered: list[Plan]) -> tuple[bool, bool]:
    """How much an example looks like this offer: the same first plan's
    tools, the same number of plans. A model this small copies the nearest
    example, so the closest comes last."""
    question, _ = example
    listed = question.split("plans:\n", 1)[1].splitlines()
    first = [step["tool"] for step in json.loads(listed[0].split(". ", 1)[1])]
    return first == [step.tool for step in offered[0].steps], len(listed) == len(offered)


def messages(evidence: Evidence, offered: list[Plan]) -> list[tuple[str, str]]:
    """(role, content) pairs: system, the worked examples (the closest to
    this offer last), the failure."""
    chat: list[tuple[str, str]] = [("system", SYSTEM)]
    for question, answer in sorted(EXAMPLES, key=lambda e: _closeness(e, offered)):
        chat += [("user", question), ("assistant", answer)]
    findings = evidence.findings[:MAX_FINDINGS] or ["nothing changed before the failure"]
    own = [line for line in evidence.journal if not SYSTEMD_LINES.search(line)]
    findings += [f"journal: {line[:160]}" for line in own[-MAX_JOURNAL:]]
    plans = "\n".join(f"{n}. {plan_text(plan)}" for n, plan in enumerate(offered, 1))
    chat.append(("user", f"unit: {evidence.unit}\nfindings: {'; '.join(findings)}\n"
                         f"cause: {evidence.cause}\nplans:\n{plans}"))
    return chat


def _const(value: Any) -> dict[str, Any]:
    """A schema that accepts exactly `value` (an object of strings, or one)."""
    if isinstance(value, dict):
        return {"type": "object", "additionalProperties": False, "required": sorted(value),
                "properties": {k: _const(v) for k, v in value.items()}}
    return {"const": value}


def answer_schema(offered: list[Plan]) -> dict[str, Any]:
    """The accepted answers as a JSON schema: one branch per offered plan,
    each its steps in order, exactly (anyOf: llguidance does not take
    oneOf, and the branches cannot overlap anyway)."""
    branches = []
    for plan in offered:
        steps = [{"type": "object", "additionalProperties": False,
                  "required": ["tool", "parameters"],
                  "properties": {"tool": {"const": step.tool},
                                 "parameters": _const(dict(step.parameters))}}
                 for step in plan.steps]
        array: dict[str, Any] = {"type": "array", "minItems": len(steps),
                                 "maxItems": len(steps), "items": False}
        if steps:
            array["prefixItems"] = steps
        branches.append({"type": "object", "additionalProperties": False,
                         "required": ["plan"], "properties": {"plan": array}})
    return {"anyOf": branches}


def parse(text: str, offered: list[Plan]) -> Plan:
    """The offered plan the answer names. Strict: one JSON object with only
    "plan", equal to an offered plan step for step."""
    try:
        value: Any = json.loads(text.strip())
    except ValueError:
        raise AnswerError("not one JSON object") from None
    if not isinstance(value, dict) or set(value) != {"plan"}:
        raise AnswerError('not an object with exactly "plan"')
    for plan in offered:
        if value["plan"] == plan.wire():
            return plan
    raise AnswerError("not one of the offered plans")


def summarise(text: str, limit: int = 200) -> str:
    """The raw answer for the incident, on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"
