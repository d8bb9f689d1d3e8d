"""Pull references: parsing and the names they give models."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syntrop.modeld import names, refs


def test_hf_reference() -> None:
    ref = refs.parse("hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF@v1.0/q/model.Q4_1.gguf")
    assert ref == refs.HfRef(repo_id="HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
                             revision="v1.0", filename="q/model.Q4_1.gguf")
    assert refs.parse("hf://o/r/f.gguf") == refs.HfRef(repo_id="o/r", revision="main",
                                                        filename="f.gguf")
    assert str(refs.parse("hf://o/r/f.gguf")) == "hf://o/r/f.gguf"


def test_ollama_reference_defaults() -> None:
    assert refs.parse("ollama://qwen2.5:1.5b") == refs.OllamaRef(
        registry=None, namespace="library", model="qwen2.5", tag="1.5b")
    assert refs.parse("ollama://ns/model") == refs.OllamaRef(
        registry=None, namespace="ns", model="model", tag="latest")
    assert refs.parse("ollama://127.0.0.1:8080/ns/m:t") == refs.OllamaRef(
        registry="127.0.0.1:8080", namespace="ns", model="m", tag="t")


def test_urls_and_paths() -> None:
    assert refs.parse("https://h.example/a/b.gguf") == refs.UrlRef(url="https://h.example/a/b.gguf")
    assert refs.parse("./x.gguf") == refs.PathRef(path="./x.gguf")
    assert refs.parse("/abs/x.gguf") == refs.PathRef(path="/abs/x.gguf")


@pytest.mark.parametrize("text", [
    "", "hf://", "hf://org/repo", "hf://org/repo/", "hf://org/../f.gguf", "hf://o/r/../f",
    "hf://o/r@/f", "hf://o/r@a b/f", "ollama://", "ollama://a/b/c/d", "ollama://Upper/m",
    "ollama://m:ba d", "ollama://bad host/ns/m", "https://", "https:///path",
    "https://h.example/", "ftp://h/x", "x\x00y", "x" * 5000,
], ids=repr)
def test_invalid_references(text: str) -> None:
    with pytest.raises(refs.InvalidReference) as caught:
        refs.parse(text)
    assert caught.value.reason


def test_default_names() -> None:
    assert refs.default_name(refs.parse(
        "hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf"
    )) == "smollm2-135m-instruct:q4_1"
    assert refs.default_name(refs.parse("hf://o/Repo/other.gguf")) == "repo:other"
    assert refs.default_name(refs.parse("ollama://qwen2.5:1.5b")) == "qwen2.5:1.5b"
    assert refs.default_name(refs.parse("ollama://ns/m:t")) == "ns-m:t"
    assert refs.default_name(refs.parse("https://h/x/My Model.gguf")) == "my-model:latest"
    assert refs.default_name(refs.parse("/tmp/SmolLM2.Q8_0.gguf")) == "smollm2.q8_0:latest"


@settings(deadline=None)  # timing is not the property; CI machines are busy
@given(st.text(max_size=300))
def test_parse_never_crashes_and_default_names_are_valid(text: str) -> None:
    try:
        ref = refs.parse(text)
    except refs.InvalidReference:
        return
    names.parse(refs.default_name(ref))
