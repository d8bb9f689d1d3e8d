"""Sampling validation and stop-sequence scanning (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syntrop.runtimed.sampling import SamplingError, StopScanner, validate


@pytest.mark.parametrize(("parameter", "value"), [
    ("max_tokens", 0), ("max_tokens", 5000), ("temperature", -0.1), ("temperature", 11.0),
    ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1), ("seed", -1), ("seed", 1 << 32),
    ("stop", [""]), ("stop", ["x"] * 9), ("stop", ["x" * 257]),
    ("min_p", -0.01), ("min_p", 1.01), ("min_p", float("nan")),
])
def test_validate_out_of_range_names_parameter(parameter: str, value: object) -> None:
    with pytest.raises(SamplingError) as caught:
        validate(n_ctx=2048, **{parameter: value})  # type: ignore[arg-type]
    assert caught.value.parameter == parameter


def test_validate_defaults_fill_and_seed_is_kept() -> None:
    params = validate(n_ctx=100, seed=7, temperature=0.0)
    assert params.seed == 7 and params.temperature == 0.0
    assert params.max_tokens == 100
    assert validate(n_ctx=2048).max_tokens == 256
    assert validate(n_ctx=2048).min_p == 0.05  # llama.cpp's default
    assert validate(n_ctx=2048, min_p=0.0).min_p == 0.0


def test_stop_scanner_never_emits_stop_sequence() -> None:
    scanner = StopScanner(("<|im_end|>",))
    out = []
    stopped = False
    for piece in ["Paris is", " nice<|im", "_end|> more"]:
        text, stopped = scanner.feed(piece)
        out.append(text)
        if stopped:
            break
    assert stopped and "".join(out) == "Paris is nice"


def test_stop_scanner_releases_false_start() -> None:
    scanner = StopScanner(("END",))
    assert scanner.feed("abcE") == ("abc", False)
    assert scanner.feed("x") == ("Ex", False)
    assert scanner.feed("EN") == ("", False)
    assert scanner.flush() == "EN"


@given(st.lists(st.text(alphabet="abXY", max_size=5), max_size=12))
def test_stop_scanner_equals_whole_text_cut(pieces: list[str]) -> None:
    scanner = StopScanner(("XY", "aba"))
    out = []
    stopped = False
    for piece in pieces:
        text, stopped = scanner.feed(piece)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(scanner.flush())
    whole = "".join(pieces)
    cuts = [i for i in (whole.find("XY"), whole.find("aba")) if i >= 0]
    assert "".join(out) == (whole[: min(cuts)] if cuts else whole)
