"""Prefix reuse, manifest digests and the owner fence (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syntrop.runtimed.sessions import (
    SessionTable,
    StaleSession,
    UnknownSession,
    common_prefix,
    manifest_digest,
    plan_prefix,
    token_hash,
)

MANIFEST = {"profile": "p", "model": "m", "model_digest": "d", "tokenizer_digest": "t",
            "template_digest": "x", "runtime_digest": "r", "bos": "add"}


def test_common_prefix_stops_at_first_difference() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


@given(st.lists(st.integers(0, 50)), st.lists(st.integers(0, 50)))
def test_plan_prefix_accounts_for_every_token(resident: list[int], wanted: list[int]) -> None:
    plan = plan_prefix(resident, "a", wanted, "a")
    assert plan.reused + plan.dropped == len(resident)
    assert plan.reused + len(plan.prefill) == len(wanted)
    assert resident[: plan.reused] == wanted[: plan.reused]


def test_plan_prefix_unchanged_reuses_all() -> None:
    plan = plan_prefix([1, 2, 3], "a", [1, 2, 3], "a")
    assert (plan.reused, plan.dropped, plan.prefill) == (3, 0, [])


def test_plan_prefix_changed_manifest_reuses_none() -> None:
    plan = plan_prefix([1, 2, 3], "a", [1, 2, 3], "b")
    assert (plan.reused, plan.dropped, plan.prefill) == (0, 3, [1, 2, 3])


def test_plan_prefix_drops_suffix_and_generated_tokens() -> None:
    plan = plan_prefix([1, 2, 3, 7, 8], "a", [1, 2, 3], "a")
    assert (plan.reused, plan.dropped, plan.prefill) == (3, 2, [])


def test_manifest_digest_is_canonical_and_sensitive() -> None:
    reordered = dict(reversed(list(MANIFEST.items())))
    assert manifest_digest(MANIFEST) == manifest_digest(reordered)
    for key in MANIFEST:
        assert manifest_digest(MANIFEST) != manifest_digest({**MANIFEST, key: "other"}), key


def test_token_hash_distinguishes_order() -> None:
    assert token_hash([1, 2]) != token_hash([2, 1])
    assert len(token_hash([])) == 64


def test_session_table_takeover_ends_older_sessions() -> None:
    table: SessionTable[str] = SessionTable()
    assert table.fence("owner-a") == []
    old = table.add(owner="owner-a", model="m", engine="e1")
    assert table.get(old.session_id) is old
    ended = table.fence("owner-b")
    assert ended == [old] and old.closed
    with pytest.raises(StaleSession):
        table.get(old.session_id)
    with pytest.raises(StaleSession):
        table.remove(old.session_id)
    new = table.add(owner="owner-b", model="m", engine="e2")
    assert table.fence("owner-b") == []
    assert table.get(new.session_id) is new


def test_session_table_unknown_and_closed() -> None:
    table: SessionTable[str] = SessionTable()
    table.fence("o")
    with pytest.raises(UnknownSession):
        table.get("nope")
    session = table.add(owner="o", model="m", engine="e")
    assert table.remove(session.session_id).closed
    with pytest.raises(UnknownSession):
        table.get(session.session_id)


def test_a_takeover_ends_only_its_own_uids_sessions() -> None:
    """Owner epochs are per uid: another local user opening a session under
    a new owner id leaves everyone else's sessions alone."""
    table: SessionTable[str] = SessionTable()
    table.fence("router-1", uid=0)
    routers = table.add(owner="router-1", model="m", engine="e1", uid=0)
    table.fence("mine", uid=65534)
    theirs = table.add(owner="mine", model="m", engine="e2", uid=65534)
    assert table.get(routers.session_id) is routers
    assert table.fence("mine-2", uid=65534) == [theirs]
    assert table.get(routers.session_id) is routers
    with pytest.raises(StaleSession) as caught:
        table.get(theirs.session_id)
    assert caught.value.owner == "mine-2"


def test_a_templates_prompt_format_is_known_by_its_markers() -> None:
    from syntrop.runtimed.sessions import template_format

    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
    assert template_format(chatml) == "chatml"
    assert template_format("<start_of_turn>user\n{{ content }}<end_of_turn>") == "gemma"
    assert template_format("<|start_header_id|>{{ role }}<|end_header_id|>") == "llama3"
    assert template_format("[INST] {{ content }} [/INST]") == "mistral"
    assert template_format("{{ content }}") is None and template_format(None) is None


def test_a_declared_prompt_format_is_one_runtimed_knows() -> None:
    import pytest

    from syntrop.interfaces.runtime import SessionConfig
    from syntrop.runtimed.checks import prompt_format
    from syntrop.varlink import InvalidParameter

    def config(value: str | None) -> SessionConfig:
        return SessionConfig(n_ctx=None, n_batch=None, n_threads=None, n_gpu_layers=None,
                             flash_attn=None, kv_cache_type=None, prompt_format=value,
                             disable_bos=None)

    assert prompt_format(config("chatml")) == "chatml"
    assert prompt_format(config(None)) is None and prompt_format(config("")) is None
    assert prompt_format(None) is None
    with pytest.raises(InvalidParameter):
        prompt_format(config("klingon"))
