"""The conformance suite (tests/conformance) against routerd, socket-activated
in front of runtimed's SmolLM2: every feature passes, one test per feature
so a failure names it."""

import importlib.util
from collections.abc import Iterator

import pytest

from tests.conformance import CHECKS, Clients, clients
from tests.models import require_llama, router_node

require_llama()
if importlib.util.find_spec("openai") is None or importlib.util.find_spec("anthropic") is None:
    pytest.skip("the openai and anthropic clients are not installed (pip install -e '.[test]')",
                allow_module_level=True)

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    with router_node(tmp_path_factory.mktemp("routerd-conformance")) as port:
        on = clients(f"http://127.0.0.1:{port}/v1")
        yield on
        on.openai.close()
        if on.anthropic is not None:
            on.anthropic.close()


@pytest.mark.parametrize("feature", CHECKS, ids=lambda check: check.name)
def test_feature(served: Clients, feature: object) -> None:
    result = feature(served.openai, served.anthropic, "smollm2")  # type: ignore[operator]
    assert result.ok, f"{result.feature}: {result.reason}"
