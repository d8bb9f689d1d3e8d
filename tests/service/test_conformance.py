"""The conformance suite (tests/conformance) against routerd, socket-activated
in front of runtimed's SmolLM2: every feature passes, one test per feature
so a failure names it."""

import http.client
import importlib.util
import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import varlink

from tests.conformance import CHECKS, ROUTERD_TOML, Clients, clients
from tests.models import model_node, require_llama
from tests.support import activated

require_llama()
if importlib.util.find_spec("openai") is None or importlib.util.find_spec("anthropic") is None:
    pytest.skip("the openai and anthropic clients are not installed (pip install -e '.[test]')",
                allow_module_level=True)

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    root = tmp_path_factory.mktemp("routerd-conformance")
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "routerd.toml").write_text(ROUTERD_TOML)
    with ExitStack() as stack, model_node(root, stack):
        daemon = stack.enter_context(activated("routerd", root))
        client = varlink.Client(address=daemon.address)
        with client.open("io.syntrop.Router1") as router:
            ingress = router.GetStatus()["ingress"]
        client.cleanup()
        port = next(int(a.rpartition(":")[2]) for a in ingress if a.startswith("127.0.0.1:"))
        # runtimed loads the model on its first request: here, not in a check.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("POST", "/v1/completions", body=json.dumps(
            {"model": "smollm2", "prompt": "Hi", "max_tokens": 1}))
        assert connection.getresponse().status == 200
        connection.close()
        on = clients(f"http://127.0.0.1:{port}/v1")
        yield on
        on.openai.close()
        if on.anthropic is not None:
            on.anthropic.close()


@pytest.mark.parametrize("feature", CHECKS, ids=lambda check: check.name)
def test_feature(served: Clients, feature: object) -> None:
    result = feature(served.openai, served.anthropic, "smollm2")  # type: ignore[operator]
    assert result.ok, f"{result.feature}: {result.reason}"
