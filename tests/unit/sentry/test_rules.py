from syntrop.sentry import rules
from syntrop.sentry.rules import Change

S = 1_000_000
FAIL = 1_000_000 * S


def test_rules_recent_dropin_reverts_persistent() -> None:
    changes = [Change(kind="dropin", timestamp_usec=FAIL - 5 * S,
                      path="/etc/systemd/system/a.service.d/x.conf", unit="a.service")]
    decision = rules.decide("a.service", changes, FAIL, breaker_open=False)
    assert decision is not None
    assert decision.tool == "revert_dropin"
    assert decision.parameters == {"unit": "a.service", "scope": "persistent"}


def test_rules_runtime_dropin_reverts_runtime_scope() -> None:
    changes = [Change(kind="dropin", timestamp_usec=FAIL - S,
                      path="/run/systemd/system/a.service.d/x.conf", unit="a.service")]
    decision = rules.decide("a.service", changes, FAIL, breaker_open=False)
    assert decision is not None and decision.parameters["scope"] == "runtime"


def test_rules_old_dropin_restarts() -> None:
    changes = [Change(kind="dropin", timestamp_usec=FAIL - 3600 * S, unit="a.service")]
    decision = rules.decide("a.service", changes, FAIL, breaker_open=False)
    assert decision is not None and decision.tool == "unit_restart"


def test_rules_other_units_dropin_restarts() -> None:
    changes = [Change(kind="dropin", timestamp_usec=FAIL - S, unit="b.service")]
    decision = rules.decide("a.service", changes, FAIL, breaker_open=False)
    assert decision is not None and decision.tool == "unit_restart"


def test_rules_template_dropin_applies_to_instance() -> None:
    changes = [Change(kind="dropin", timestamp_usec=FAIL - S, unit="web@.service")]
    decision = rules.decide("web@1.service", changes, FAIL, breaker_open=False)
    assert decision is not None and decision.tool == "revert_dropin"


def test_rules_non_dropin_change_restarts() -> None:
    changes = [Change(kind="config", timestamp_usec=FAIL - S, unit="a.service")]
    decision = rules.decide("a.service", changes, FAIL, breaker_open=False)
    assert decision is not None and decision.tool == "unit_restart"


def test_rules_breaker_open_does_nothing() -> None:
    changes = [Change(kind="dropin", timestamp_usec=FAIL - S, unit="a.service")]
    assert rules.decide("a.service", changes, FAIL, breaker_open=True) is None
