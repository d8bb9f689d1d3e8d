"""The deterministic fallback: what to do when the model cannot decide.

A drop-in of the unit changed shortly before the failure → revert_dropin
(scope runtime when it lives under /run, else persistent); otherwise
unit_restart; nothing when the breaker is open. Pure: the facts come in as
arguments.
"""

from dataclasses import dataclass, field
from typing import Any

#: How close before the failure a drop-in change must be to be blamed.
DEFAULT_RECENT_USEC = 600 * 1_000_000
#: The tool name that means "do nothing".
NONE = "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """A change contextd reported: its kind (dropin, unit_file, config,
    package, kernel), when, the path or package when there is one, its
    action (modified, upgrade, gpu, ...) and contextd's one-line summary."""

    kind: str
    timestamp_usec: int
    path: str | None = None
    unit: str | None = None
    action: str | None = None
    package: str | None = None
    summary: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """A Tool1.Execute call: the tool and its parameters."""

    tool: str
    parameters: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def recent_dropin(unit: str, changes: list[Change], failure_usec: int,
                  recent_usec: int = DEFAULT_RECENT_USEC) -> Change | None:
    """The newest drop-in change of `unit` within recent_usec before (or at)
    the failure, if any. Changes a little after the failure time count too
    (clock skew between the journal and the file watcher: one second)."""
    best: Change | None = None
    for change in changes:
        if change.kind != "dropin":
            continue
        if change.unit is not None and change.unit != unit and not _applies(change.unit, unit):
            continue
        if not failure_usec - recent_usec <= change.timestamp_usec <= failure_usec + 1_000_000:
            continue
        if best is None or change.timestamp_usec > best.timestamp_usec:
            best = change
    return best


def _applies(pattern: str, unit: str) -> bool:
    """A template (foo@.service) or prefix (foo-.service) drop-in's unit."""
    stem, _, suffix = pattern.rpartition(".")
    if not unit.endswith("." + suffix):
        return False
    if stem.endswith("@"):
        return unit.startswith(stem)
    if stem.endswith("-"):
        return unit.startswith(stem)
    return False


def decide(unit: str, changes: list[Change], failure_usec: int, *, breaker_open: bool,
           recent_usec: int = DEFAULT_RECENT_USEC) -> Decision | None:
    """The rules' action for a failed unit, or None."""
    if breaker_open:
        return None
    change = recent_dropin(unit, changes, failure_usec, recent_usec)
    if change is not None:
        scope = "runtime" if (change.path or "").startswith("/run/") else "persistent"
        return Decision(
            tool="revert_dropin", parameters={"unit": unit, "scope": scope},
            reason=f"drop-in {change.path or '?'} changed before the failure",
        )
    return Decision(tool="unit_restart", parameters={"unit": unit},
                    reason="no recent drop-in change: restart")
