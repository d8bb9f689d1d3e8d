"""The model's plan, as pure functions: the prompt, the accepted answers as
a JSON schema, and the strict reading of the answer.

The model sees what the rules see: the unit, the findings one line each
(times relative to the failure, unlinked changes marked so), the journal's
own lines, the cause the rules named, and the plans it may choose from
(findings.candidates: the rules' plan, the plans of the other linked
findings, nothing). Each plan is offered by a name that says what it does
(revert_dropin, clear_cache, reload, restart, nothing) with the path it
acts on, and the answer is one JSON object {"plan": NAME} naming one of
them: anything else is rejected and the rules' plan stands.
`answer_schema()` is that contract as a JSON schema, for a decoding
constraint, so a constrained answer always parses.

Design note: asked for the first, second or third of a numbered list,
small models (SmolLM2-135M, Qwen2.5-Coder-0.5B and -1.5B) chose by
position, not by content (bench/bench_triage.py). So the plans are listed
by name in one fixed order, whatever the order of the offer (the prompt
is the same for every order: the answer cannot depend on it), and the
worked examples cover every kind of plan, including the judgment the rules
cannot make (a drop-in and a cache both linked, the journal naming one; a
program missing because a drop-in points at it, or because it was
removed). The system line and the examples are `prefix_messages()`, the
same on every call (a warm session evaluates them once); the failure is
`suffix_messages()`.

Measured (bench/bench_triage.py, 33 labelled failures, 2 orders each, one
thread): Qwen2.5-Coder-0.5B right in 86% (the rules 82%, the plan listed
first 79%, the first offered 56%), and in 13 of 18 where the rules say a
human must (the rules 12), 1.75 s per new failure at the median;
Qwen2.5-Coder-1.5B 82% at 3.5 s; SmolLM2-135M answers "nothing" to
everything (55%).
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from syntrop.sentry.findings import Plan

#: Decoding: greedy and short. The longest answer, {"plan":"revert_dropin"},
#: is about 10 tokens.
MAX_TOKENS = 16
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

#: A plan's name by its tools; listed in this order.
NAMES: dict[tuple[str, ...], str] = {
    ("revert_dropin",): "revert_dropin",
    ("clear_cache", "unit_restart"): "clear_cache",
    ("daemon_reload", "unit_restart"): "reload",
    ("unit_restart",): "restart",
    (): "nothing",
}

SYSTEM = ("You are systemd-sentry. A systemd unit failed. Read its findings and journal and "
          "choose the offered plan that fixes what they point at:\n"
          "revert_dropin: a drop-in changed before the failing start broke it (the journal "
          "names the drop-in or its setting, or the program it points at is missing);\n"
          "clear_cache: the journal names a corrupt file in the unit's cache;\n"
          "reload: systemd runs an old definition;\n"
          "restart: nothing the tools can undo explains it;\n"
          "nothing: a human must (the program was removed, it keeps failing, a dependency "
          "failed).\n"
          'Answer with one JSON object: {"plan": NAME}.')

_SUBJECT = re.compile(r"\((/[^()\s]+)\)")


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


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def plan_text(plan: Plan) -> str:
    return _compact(plan.wire())


def _base_name(plan: Plan) -> str:
    tools = tuple(step.tool for step in plan.steps)
    return NAMES.get(tools, "+".join(tools))


def named(offered: list[Plan]) -> list[tuple[str, Plan]]:
    """The offered plans by name, in the fixed order of NAMES (then by
    name): the same list whatever the order of the offer. Two plans of the
    same tools (not offered by findings.candidates) get a number."""
    order = list(NAMES.values())
    listed = sorted(offered, key=lambda p: (order.index(_base_name(p))
                                            if _base_name(p) in order else len(order),
                                            _base_name(p), plan_text(p)))
    out: list[tuple[str, Plan]] = []
    for plan in listed:
        name = _base_name(plan)
        taken = sum(1 for other, _ in out if other == name or other.startswith(name + "_"))
        out.append((f"{name}_{taken + 1}" if taken else name, plan))
    return out


def _line(name: str, plan: Plan) -> str:
    subject = _SUBJECT.search(plan.reason)
    return f"{name}" + (f" ({subject.group(1)})" if subject else "")


def _question(unit: str, findings: list[str], journal: list[str], cause: str,
              names: list[str]) -> str:
    lines = "; ".join(findings[:MAX_FINDINGS]) or "nothing changed before the failure"
    own = [line[:160] for line in journal if not SYSTEMD_LINES.search(line)][-MAX_JOURNAL:]
    return (f"unit: {unit}\nfindings: {lines}\njournal: {' | '.join(own) or '-'}\n"
            f"cause (the rules): {cause}\nplans: {', '.join(names)}")


def _example(unit: str, findings: list[str], journal: list[str], cause: str,
             plans: list[str], answer: str) -> tuple[str, str]:
    return _question(unit, findings, journal, cause, plans), _compact({"plan": answer})


EXAMPLES: tuple[tuple[str, str], ...] = (
    _example("web.service", ["main process exited with status 1",
                             "drop-in /etc/systemd/system/web.service.d/50-opts.conf changed "
                             "8 s before the failure"],
             ["web: unrecognized option --workers=x"],
             "drop-in /etc/systemd/system/web.service.d/50-opts.conf changed 8 s before the "
             "failure",
             ["revert_dropin (/etc/systemd/system/web.service.d/50-opts.conf)", "nothing"],
             "revert_dropin"),
    _example("api.service", ["main process exited with status 203",
                             "program /usr/local/bin/api-old is missing",
                             "systemd runs an old definition (the unit file changed on disk)"],
             [], "systemd runs an old definition (the unit file changed on disk)",
             ["reload", "nothing"], "reload"),
    _example("db.service", ["main process exited with status 1",
                            "the journal names the cache /var/cache/db"],
             ["db: bad checksum in /var/cache/db/pages.bin"],
             "the journal names the cache /var/cache/db",
             ["clear_cache (/var/cache/db)", "nothing"], "clear_cache"),
    _example("chat.service", ["main process killed by signal 11",
                              "drop-in /etc/systemd/system/chat.service.d/10-nice.conf changed "
                              "1200 s before the failure (not linked to it)"],
             ["chat: segfault at 0000000000000008"],
             "no change explains it (main process killed by signal 11)",
             ["restart", "nothing"], "restart"),
    _example("lb.service", ["main process exited with status 1",
                            "config /etc/lb/lb.conf edited 2 s before the failure"],
             ["lb: syntax error in /etc/lb/lb.conf line 9"],
             "config /etc/lb/lb.conf edited 2 s before the failure",
             ["restart", "nothing"], "restart"),
    _example("wiki.service", ["main process exited with status 1",
                              "drop-in /etc/systemd/system/wiki.service.d/override.conf changed "
                              "9 s before the failure",
                              "the journal names the cache /var/cache/wiki"],
             ["wiki: corrupt page cache /var/cache/wiki/pages.db"],
             "drop-in /etc/systemd/system/wiki.service.d/override.conf changed 9 s before the "
             "failure",
             ["revert_dropin (/etc/systemd/system/wiki.service.d/override.conf)",
              "clear_cache (/var/cache/wiki)", "nothing"], "clear_cache"),
    _example("shop.service", ["main process exited with status 1",
                              "drop-in /etc/systemd/system/shop.service.d/50-cache.conf changed "
                              "9 s before the failure",
                              "the journal names the cache /var/cache/shop"],
             ["shop: invalid CacheSize=lots set in "
              "/etc/systemd/system/shop.service.d/50-cache.conf", "shop: cache /var/cache/shop"],
             "drop-in /etc/systemd/system/shop.service.d/50-cache.conf changed 9 s before the "
             "failure",
             ["revert_dropin (/etc/systemd/system/shop.service.d/50-cache.conf)",
              "clear_cache (/var/cache/shop)", "nothing"], "revert_dropin"),
    _example("auth.service", ["main process exited with status 203",
                              "program /usr/local/bin/auth-v3 is missing",
                              "drop-in /etc/systemd/system/auth.service.d/50-auth-v3.conf changed "
                              "7 s before the failure"],
             ["auth.service: Failed to locate executable /usr/local/bin/auth-v3: No such file "
              "or directory"],
             "program /usr/local/bin/auth-v3 is missing",
             ["revert_dropin (/etc/systemd/system/auth.service.d/50-auth-v3.conf)", "nothing"],
             "revert_dropin"),
    _example("ftp.service", ["main process exited with status 203",
                             "program /usr/sbin/ftpd is missing",
                             "drop-in /etc/systemd/system/ftp.service.d/10-umask.conf changed "
                             "7 s before the failure"],
             ["dpkg: removing ftpd (1.4) ...",
              "ftp.service: Failed to locate executable /usr/sbin/ftpd: No such file or "
              "directory"],
             "program /usr/sbin/ftpd is missing",
             ["revert_dropin (/etc/systemd/system/ftp.service.d/10-umask.conf)", "nothing"],
             "nothing"),
    _example("app.service", ["dependency net.service failed"], [],
             "dependency net.service failed", ["nothing"], "nothing"),
)


def prefix_messages() -> list[tuple[str, str]]:
    """The stable part of the prompt: the system line and the worked
    examples, identical on every call (a warm session evaluates it once)."""
    chat: list[tuple[str, str]] = [("system", SYSTEM)]
    for question, answer in EXAMPLES:
        chat += [("user", question), ("assistant", answer)]
    return chat


def suffix_messages(evidence: Evidence, offered: list[Plan]) -> list[tuple[str, str]]:
    """The incident's own turn: the unit, its findings and journal lines,
    the rules' cause and the offered plans by name, in a fixed order."""
    names = [_line(name, plan) for name, plan in named(offered)]
    return [("user", _question(evidence.unit, evidence.findings, evidence.journal,
                               evidence.cause, names))]


def messages(evidence: Evidence, offered: list[Plan]) -> list[tuple[str, str]]:
    """(role, content) pairs: the stable prefix, then the incident."""
    return prefix_messages() + suffix_messages(evidence, offered)


def answer_schema(offered: list[Plan]) -> dict[str, Any]:
    """The accepted answers as a JSON schema: {"plan": NAME}, NAME one of
    the offered plans' names."""
    return {"type": "object", "additionalProperties": False, "required": ["plan"],
            "properties": {"plan": {"enum": [name for name, _ in named(offered)]}}}


def parse(text: str, offered: list[Plan]) -> Plan:
    """The offered plan the answer names. Strict: one JSON object with only
    "plan", the name of an offered plan."""
    try:
        value: Any = json.loads(text.strip())
    except ValueError:
        raise AnswerError("not one JSON object") from None
    if not isinstance(value, dict) or set(value) != {"plan"}:
        raise AnswerError('not an object with exactly "plan"')
    for name, plan in named(offered):
        if value["plan"] == name:
            return plan
    raise AnswerError("not one of the offered plans")


def summarise(text: str, limit: int = 200) -> str:
    """The raw answer for the incident, on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"
