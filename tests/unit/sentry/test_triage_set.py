"""The labelled triage set (bench/triage_set.py) is whole: enough
failures, every finding kind on both sides of its split, each right plan
among what plans.candidates offers, names unique."""

from collections import Counter

import pytest
from bench import triage_set
from bench.triage_set import Offer, tools

from syntrop.sentry import findings

#: Every finding kind findings.py knows (and `transient`: nothing linked).
KINDS = {findings.DEPENDENCY, findings.EXEC_MISSING, findings.STALE_DEFINITION,
         findings.DROPIN, findings.STALE_CACHE, findings.STALE_STATE,
         findings.CONFIG_REPLACED, findings.CONFIG_EDITED, findings.UNIT_FILE,
         findings.CRASH_LOOP, findings.RESOURCE, findings.TRANSIENT,
         findings.ACCOUNT_MISSING, findings.DISK_FULL, findings.OOM_KILLED,
         findings.TRANSIENT_ERROR, findings.PACKAGE_UPGRADED}


@pytest.fixture(scope="module")
def every() -> list[Offer]:
    return triage_set.offers()


def test_enough_failures_with_unique_names(every: list[Offer]) -> None:
    assert len(every) >= 60
    names = Counter(offer.incident.name for offer in every)
    assert [name for name, n in names.items() if n > 1] == []


def test_the_right_plan_is_offered(every: list[Offer]) -> None:
    for offer in every:
        assert offer.incident.right in {tools(plan) for plan in offer.offered}, \
            offer.incident.name
        assert set(offer.incident.right) <= set(triage_set.TOOLS)


def test_every_kind_is_a_cause_in_both_halves(every: list[Offer]) -> None:
    for held_out in (True, False):
        half = {offer.kind for offer in every if offer.incident.held_out == held_out}
        assert half == KINDS, f"held_out={held_out}: missing {KINDS - half}"


def test_the_split_is_about_half(every: list[Offer]) -> None:
    held_out = sum(offer.incident.held_out for offer in every)
    assert abs(2 * held_out - len(every)) <= len(every) // 10
    assert all(i.held_out for i in triage_set.HELD_OUT)
    assert not any(i.held_out for i in triage_set.TUNING)


def test_a_wrong_restart_is_offered_in_the_held_out_half(every: list[Offer]) -> None:
    """The set can show a model that restarts whatever is offered."""
    wrong = [o for o in every if o.incident.held_out and o.restart() is not None
             and o.incident.right != triage_set.RESTART]
    kinds = {o.kind for o in wrong}
    assert {findings.DROPIN, findings.STALE_DEFINITION, findings.CONFIG_EDITED} <= kinds
    assert any(o.incident.right == triage_set.RESTART for o in every if o.incident.held_out)
