"""Model names and digests: what the Varlink boundary lets through."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syntrop.modeld import names

BAD = [
    "", ".", "..", "a/b", "/abs", "a\0b", "a\nb", "a\tb", "a b", "a\x7fb", "a\u202eb",
    "a:b:c", "a:", ":b", "a:..", "a:.", "a:b/c", "x" * 129, "é" * 65, "a\\b", "\udc80",
]


@pytest.mark.parametrize("text", BAD, ids=repr)
def test_parse_rejects_bad_identifiers(text: str) -> None:
    with pytest.raises(names.InvalidName):
        names.parse(text)


def test_parse_name_tag_and_default_tag() -> None:
    assert names.parse("smollm2") == names.ModelName(name="smollm2", tag="latest")
    assert names.parse("qwen2.5-coder-1.5b:q4_k_m") == names.ModelName(
        name="qwen2.5-coder-1.5b", tag="q4_k_m")
    assert str(names.parse("a:b")) == "a:b"
    assert names.parse("x" * 128).name == "x" * 128


def test_pinned_spelling_means_latest_pinned() -> None:
    parsed = names.parse("qwen2.5-coder-1.5b:pinned")
    assert (parsed.name, parsed.tag, parsed.pinned) == ("qwen2.5-coder-1.5b", "latest", True)


@settings(deadline=None)  # timing is not the property; CI machines are busy
@given(st.text(min_size=1, max_size=40))
def test_accepted_names_are_safe_path_segments(text: str) -> None:
    try:
        parsed = names.parse(text)
    except names.InvalidName as error:
        assert len(error.identifier) <= names.ECHO
        return
    for segment in (parsed.name, parsed.tag):
        assert segment not in ("", ".", "..")
        assert not any(c in segment for c in "/\\:\0")
        assert all(c.isprintable() and not c.isspace() for c in segment)
        assert len(segment.encode()) <= names.MAX_SEGMENT
    assert names.parse(str(parsed)).name == parsed.name


@settings(deadline=None)  # timing is not the property; CI machines are busy
@given(st.text(max_size=200))
def test_slug_is_always_a_valid_segment(text: str) -> None:
    assert names.valid_segment(names.slug(text))


def test_digest_normalises_and_rejects() -> None:
    hex64 = "AB" * 32
    assert names.digest(hex64) == "ab" * 32
    assert names.digest(f"sha256:{'cd' * 32}") == "cd" * 32
    for bad in ("", "ab" * 31, "zz" * 32, "sha512:" + "ab" * 32, "ab" * 33):
        with pytest.raises(names.InvalidDigest):
            names.digest(bad)
