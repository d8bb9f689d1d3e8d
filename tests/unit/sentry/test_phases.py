"""phases.Live.context: what one missing source does to the others."""

import asyncio

from syntrop.sentry.findings import UnitFacts
from syntrop.sentry.phases import Live


def test_systemds_view_survives_a_timeline_that_could_not_be_read() -> None:
    live = Live(systemd=None, model="smollm2")

    async def timeline(unit: str, failure_usec: int) -> object:
        raise ConnectionResetError("contextd went away")

    async def facts(unit: str) -> UnitFacts:
        return UnitFacts(unit=unit, need_daemon_reload=True)

    async def tools() -> list[str]:
        return ["daemon_reload", "unit_restart"]

    live._timeline = timeline  # type: ignore[method-assign,assignment]
    live.unit_facts = facts  # type: ignore[method-assign]
    live._tools = tools  # type: ignore[method-assign]
    got = asyncio.run(live.context("a.service", 1_000))
    assert got.unit is not None and got.unit.need_daemon_reload
    assert got.tools == ("daemon_reload", "unit_restart")
    assert got.changes == [] and got.failure_usec == 1_000
    assert got.unread == ("contextd's timeline: ConnectionResetError: contextd went away",)
    assert "not read: contextd's timeline" in got.summary


def test_the_triage_model_is_chosen_from_what_modeld_holds_now() -> None:
    from syntrop.sentry.phases import choose_model

    # The configured one, whatever modeld holds (SmolLM2 only when named).
    assert choose_model("smollm2", ["qwen2.5-coder-0.5b"]) == "smollm2"
    # Else the best triage model there, in either order of pulling.
    for held in (["smollm2", "qwen2.5-coder-0.5b"], ["qwen2.5-coder-0.5b", "smollm2"]):
        assert choose_model(None, held) == "qwen2.5-coder-0.5b"
    assert choose_model(None, ["smollm2", "qwen2.5-coder-1.5b:latest"]) == "qwen2.5-coder-1.5b"
    assert choose_model(None, ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]) == \
        "qwen2.5-coder-0.5b"
    # Never SmolLM2 (unfit: it answers "nothing" to everything), nor any other.
    assert choose_model(None, ["smollm2", "gemma3-270m"]) is None
    assert choose_model(None, []) is None


def test_no_triage_model_is_said_and_the_model_is_not_asked() -> None:
    """modeld holds only SmolLM2: ready() fails at once, saying so (the
    pipeline's decide phase then records it and the rules decide)."""
    import pytest

    live = Live(systemd=None, model=None)

    async def only_smollm2() -> tuple[str, str]:
        from syntrop.sentry.phases import choose_model
        from syntrop.sentry.warm import NoTriageModel

        if choose_model(None, ["smollm2"]) is None:
            live.chosen = None
            raise NoTriageModel("no triage model in modeld")
        raise AssertionError("chose a model")

    live._model = only_smollm2  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="no triage model"):
        asyncio.run(live.ready())
    assert live.chosen is None
