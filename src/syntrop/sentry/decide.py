"""The model's plan, as pure functions: the prompt, the accepted answers as
a JSON schema, and the strict reading of the answer.

The model sees what the rules see, in few words: the journal's own lines,
the findings and the plans it may choose from (plans.candidates: every
plan that could apply), with the
paths cut to their base names and the words of findings.py shortened
(SHORT). Left out, as they repeat what is there: the rules' cause (one of
the findings), each plan's subject (in the findings), the seconds before
the failure (a change is linked to it or marked unlinked), the exit status
beside other findings, systemd's line for a missing program. Each plan is
offered by a one-token name that says what it does (undo, clear, reload,
restart, nothing; what each means is in the system line), and the answer
is that name as one JSON string: anything else is rejected and the rules'
plan stands. `answer_schema()` is that contract as a JSON schema, for a
decoding constraint, so a constrained answer always parses.

Design note: asked for the first, second or third of a numbered list,
small models (SmolLM2-135M, Qwen2.5-Coder-0.5B and -1.5B) chose by
position, not by content (bench/bench_triage.py). So the plans are listed
by name in one fixed order, whatever the order of the offer (the prompt
is the same for every order: the answer cannot depend on it), and the
worked examples cover every kind of plan, including the judgment the rules
cannot make (a drop-in and a cache both linked, the journal naming one; a
program missing because a drop-in points at it, or because it was
removed). The system line and the examples are `prefix_messages()`, the
same on every call (a warm session evaluates them once, so its words are
free); the failure is `suffix_messages()`, prefilled per failure: short,
because under load prefill runs at about 70 tokens/s and each answer
token costs a decode step (60-70 ms).

Measured (bench/bench_triage.py, 77 labelled failures, every plan that
could apply offered, tuned on the tuning half only; docs/BENCHMARKS.md):
Qwen2.5-Coder-0.5B right in 67.6 % of the held-out half (the rules alone
81.1 %, always restart 35.1 %), 72.5 % of the tuning half; where a restart
is offered and wrong it chose restart in 5 of 23 held-out failures. The
examples show the offer as sentry makes it (restart beside undo, reload,
clear and revert): before they did, it took that restart in 17 of 26.
The failure's turn is 72 tokens at most, 38 at the median (ChatML
included), the answer 3 tokens. The examples' order matters to a 0.5B
model (the last ones pull its answer): measured, keep it or measure again.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from syntrop.sentry.findings import Plan

#: Decoding: greedy and short. An answer is 3 tokens ("undo": the quotes
#: and the name), 4 with the end of the turn.
MAX_TOKENS = 8
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

#: A plan's name by its tools; listed in this order. Each is one token of
#: the model's vocabulary, so the answer is three ("undo" and its quotes).
NAMES: dict[tuple[str, ...], str] = {
    ("revert_dropin",): "undo",
    ("revert_config",): "revert",
    ("downgrade_package",): "downgrade",
    ("clear_cache", "unit_restart"): "clear",
    ("free_space", "unit_restart"): "free",
    ("daemon_reload", "unit_restart"): "reload",
    ("unit_restart",): "restart",
    (): "nothing",
}

SYSTEM = ("You are systemd-sentry. A systemd unit failed. You get the lines its journal "
          "wrote, its facts (a signal, or the exit status when nothing changed; what changed "
          "before the failure; unlinked: too long before to be the cause) and the plans you "
          "may choose. Choose the plan that fixes what they point at:\n"
          "undo: revert the drop-in that changed just before the failure: it broke the "
          "start (the journal names the drop-in or a setting or option it sets, or the "
          "missing program is the one it points at, its name in the drop-in's name);\n"
          "revert: put back a config file edited just before the failure (the journal "
          "names an error in it or its setting);\n"
          "downgrade: a package that owns the program was upgraded just before the failure: "
          "put its previous version back;\n"
          "clear: the journal names a corrupt file in the cache: clear it, then restart;\n"
          "reload: systemd runs an old definition: reload, then restart;\n"
          "free: a filesystem the journal writes to is full: free the unit's cache and the "
          "journal on it, then restart;\n"
          "restart: only a crash or a passing error with nothing changed (a signal, "
          "connection refused, try again later): the same start works again;\n"
          "nothing: a restart would fail the same way and no other plan fits: a human must "
          "(a config edited with an error, a program removed, a user or file missing, no "
          "space left, a port or lock taken, it keeps failing, a dependency failed).\n"
          "Never restart what a change broke: undo it.\n"
          "Answer with the plan's name as a JSON string.")

#: Shorter words for the findings' and the journal's (findings.Finding.line):
#: the model reads the same facts in fewer tokens.
SHORT: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), words) for pattern, words in (
        # A path: its base name.
        (r"(?<![\w.-])/(?:[^\s/:()'\"]+/)+([^\s/:()'\"]+)", r"\1"),
        (r"^main process exited with status ", "exit "),
        (r"^main process killed by signal ", "signal "),
        # When: linked or not says it (the findings' rule), not the seconds.
        (r" \d+ s before the failure", ""),
        (r" \d+ s after the failure", " after the failure"),
        (r" \(not linked to it\)$", " (unlinked)"),
        (r"^the journal names the ", "journal names "),
        (r"^systemd runs an old definition \(the unit file changed on disk\)$",
         "systemd runs an old definition"),
        (r" is missing$", " missing"),
        (r"^it keeps failing with nothing changed$", "keeps failing, nothing changed"),
        (r"\.service\b", ""),
        (r"\b0{4,}(?=[0-9a-f])", ""),  # an address's leading zeros
        (r" \(\d[\w.:~+-]*\)| \.\.\.$", ""),  # a package's version, an ellipsis
    ))
#: systemd's line for a missing program: the findings say it.
MISSING_LINE = re.compile(r"Failed to locate executable")


def short(line: str) -> str:
    """A finding's or journal line's words, shortened (SHORT)."""
    for pattern, replacement in SHORT:
        line = pattern.sub(replacement, line)
    return line


class AnswerError(ValueError):
    """The model's answer is not one of the offered plans."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What the model is told about the failure."""

    unit: str
    findings: list[str]
    cause: str
    journal: list[str]


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
    same tools (not offered by plans.candidates) get a number."""
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


def _journal(unit: str, journal: list[str]) -> list[str]:
    """The unit's own journal lines (not systemd's), shortened, without the
    unit's name in front."""
    stem = unit.removesuffix(".service")
    own = [short(line[:160]).removeprefix(f"{stem}: ") for line in journal
           if not SYSTEMD_LINES.search(line) and not MISSING_LINE.search(line)]
    return own[-MAX_JOURNAL:]


def _question(unit: str, findings: list[str], journal: list[str], names: list[str]) -> str:
    lines = [short(line) for line in findings[:MAX_FINDINGS]]
    # An exit status says little beside what changed: only alone.
    facts = "; ".join([line for line in lines if not line.startswith("exit ")] or lines)
    facts = facts or "nothing changed"
    return (f"journal: {' | '.join(_journal(unit, journal)) or '-'}\nfacts: {facts}\n"
            f"plans: {', '.join(names)}")


def _example(unit: str, findings: list[str], journal: list[str], plans: list[str],
             answer: str) -> tuple[str, str]:
    return _question(unit, findings, journal, plans), json.dumps(answer)


EXAMPLES: tuple[tuple[str, str], ...] = (
    _example("web.service", ["main process exited with status 1",
                             "drop-in /etc/systemd/system/web.service.d/50-opts.conf changed "
                             "8 s before the failure"],
             ["web: unrecognized option --workers=x"], ["undo", "restart", "nothing"], "undo"),
    _example("api.service", ["main process exited with status 203",
                             "program /usr/local/bin/api-old is missing",
                             "systemd runs an old definition (the unit file changed on disk)"],
             [], ["reload", "restart", "nothing"], "reload"),
    _example("db.service", ["main process exited with status 1",
                            "the journal names the cache /var/cache/db"],
             ["db: bad checksum in /var/cache/db/pages.bin"], ["clear", "restart", "nothing"],
             "clear"),
    _example("chat.service", ["main process killed by signal 11",
                              "drop-in /etc/systemd/system/chat.service.d/10-nice.conf changed "
                              "1200 s before the failure (not linked to it)"],
             ["chat: segfault at 0000000000000008"], ["restart", "nothing"], "restart"),
    _example("lb.service", ["main process exited with status 1",
                            "config /etc/lb/lb.conf edited 2 s before the failure"],
             ["lb: syntax error in /etc/lb/lb.conf line 9"], ["revert", "restart", "nothing"],
             "revert"),
    _example("irc.service", ["main process exited with status 1",
                             "the journal says 'irc: bind 0.0.0.0:6667: Address already in use'"],
             ["irc: bind 0.0.0.0:6667: Address already in use"], ["restart", "nothing"],
             "nothing"),
    _example("wiki.service", ["main process exited with status 1",
                              "drop-in /etc/systemd/system/wiki.service.d/override.conf changed "
                              "9 s before the failure",
                              "the journal names the cache /var/cache/wiki"],
             ["wiki: corrupt page cache /var/cache/wiki/pages.db"],
             ["undo", "clear", "restart", "nothing"], "clear"),
    _example("feed.service", ["main process exited with status 75"],
             ["feed: upstream: connection refused (will retry later)"], ["restart", "nothing"],
             "restart"),
    _example("shop.service", ["main process exited with status 1",
                              "drop-in /etc/systemd/system/shop.service.d/50-cache.conf changed "
                              "9 s before the failure",
                              "the journal names the cache /var/cache/shop"],
             ["shop: invalid CacheSize=lots set in "
              "/etc/systemd/system/shop.service.d/50-cache.conf", "shop: cache /var/cache/shop"],
             ["undo", "clear", "restart", "nothing"], "undo"),
    _example("logs.service", ["main process exited with status 1"],
             ["logs: write /var/log/logs/app.log: No space left on device"],
             ["restart", "nothing"], "nothing"),
    _example("relay.service", ["main process exited with status 1",
                               "package relayd upgraded (it owns /usr/sbin/relayd) 20 s before "
                               "the failure"],
             ["relayd: unknown option --listen-compat"], ["downgrade", "restart", "nothing"],
             "downgrade"),
    _example("spool.service", ["main process exited with status 1",
                               "no space left on /var/cache/spool/q.tmp"],
             ["spool: cannot write /var/cache/spool/q.tmp: No space left on device"],
             ["free", "restart", "nothing"], "free"),
    _example("mq.service", ["main process exited with status 1",
                            "drop-in /etc/systemd/system/mq.service.d/30-log.conf changed "
                            "6 s before the failure",
                            "the journal names the cache /var/cache/mq"],
             ["mq: truncated segment /var/cache/mq/seg.0004"],
             ["undo", "clear", "restart", "nothing"], "clear"),
    _example("auth.service", ["main process exited with status 203",
                              "program /usr/local/bin/auth-v3 is missing",
                              "drop-in /etc/systemd/system/auth.service.d/50-auth-v3.conf changed "
                              "7 s before the failure"],
             ["auth.service: Failed to locate executable /usr/local/bin/auth-v3: No such file "
              "or directory"], ["undo", "restart", "nothing"], "undo"),
    _example("ftp.service", ["main process exited with status 203",
                             "program /usr/sbin/ftpd is missing",
                             "drop-in /etc/systemd/system/ftp.service.d/10-umask.conf changed "
                             "7 s before the failure"],
             ["dpkg: removing ftpd (1.4) ...",
              "ftp.service: Failed to locate executable /usr/sbin/ftpd: No such file or "
              "directory"], ["undo", "nothing"], "nothing"),
    _example("cron.service", ["main process exited with status 1",
                              "drop-in /etc/systemd/system/cron.service.d/40-env.conf changed "
                              "4 s before the failure"],
             ["cron: bad value for MAILTO"], ["undo", "restart", "nothing"], "undo"),
    _example("pdf.service", ["main process exited with status 203",
                             "program /usr/local/bin/pdf-next is missing",
                             "drop-in /etc/systemd/system/pdf.service.d/20-pdf-next.conf "
                             "changed 5 s before the failure"],
             [], ["undo", "restart", "nothing"], "undo"),
    _example("app.service", ["dependency net.service failed"], [], ["nothing"], "nothing"),
)


def prefix_messages() -> list[tuple[str, str]]:
    """The stable part of the prompt: the system line and the worked
    examples, identical on every call (a warm session evaluates it once)."""
    chat: list[tuple[str, str]] = [("system", SYSTEM)]
    for question, answer in EXAMPLES:
        chat += [("user", question), ("assistant", answer)]
    return chat


def suffix_messages(evidence: Evidence, offered: list[Plan]) -> list[tuple[str, str]]:
    """The incident's own turn: its findings and journal lines, shortened,
    and the offered plans by name, in a fixed order. The rules' cause is
    one of the findings, and each plan's subject is in them: neither is
    repeated."""
    names = [name for name, _ in named(offered)]
    return [("user", _question(evidence.unit, evidence.findings, evidence.journal, names))]


def messages(evidence: Evidence, offered: list[Plan]) -> list[tuple[str, str]]:
    """(role, content) pairs: the stable prefix, then the incident."""
    return prefix_messages() + suffix_messages(evidence, offered)


def answer_schema(offered: list[Plan]) -> dict[str, Any]:
    """The accepted answers as a JSON schema: a string, the name of one of
    the offered plans."""
    return {"enum": [name for name, _ in named(offered)]}


#: In a warm session the answer's opening quote is part of the prompt (the
#: assistant's turn opened with it): the model writes only the plan's name,
#: constrained by `answer_regex`, and the closing quote stops the decode
#: before it is evaluated. A one-token name is then one decode step after
#: the prefill, where the JSON string took three and the end of the turn.
OPENING = '"'


def answer_regex(offered: list[Plan]) -> str:
    """The rest of the answer after OPENING: an offered plan's name and the
    closing quote."""
    return "(" + "|".join(re.escape(name) for name, _ in named(offered)) + ')"'


def parse_rest(text: str, offered: list[Plan]) -> Plan:
    """The offered plan an answer begun by OPENING names (the closing quote
    there or cut by the stop)."""
    return parse(OPENING + text.strip().removesuffix('"') + '"', offered)


def parse(text: str, offered: list[Plan]) -> Plan:
    """The offered plan the answer names. Strict: one JSON string, the name
    of an offered plan."""
    try:
        value: Any = json.loads(text.strip())
    except ValueError:
        raise AnswerError("not JSON") from None
    if not isinstance(value, str):
        raise AnswerError("not a JSON string")
    for name, plan in named(offered):
        if value == name:
            return plan
    raise AnswerError("not one of the offered plans")


def summarise(text: str, limit: int = 200) -> str:
    """The raw answer for the incident, on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"
