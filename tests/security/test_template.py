"""A GGUF whose chat template is hostile, served by a real runtimed: the
renderer's sandbox refuses it, runtimed answers InvalidModel (the sandbox's
refusal escaped as InternalError before), and the next chat with another
model is served."""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import tinymodel
from tests.models import require_llama
from tests.security.test_gguf import SSTI
from tests.service.wire import Reader, connect, encode

require_llama()

TEMPLATES = {
    "ssti": SSTI,
    "globals": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "range": "{% for i in range(10**12) %}x{% endfor %}",
}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory,
            monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Path]:
    from tests.service.runtimed_node import register, started

    root = tmp_path_factory.mktemp("template")
    files = {}
    for name, template in TEMPLATES.items():
        monkeypatch_module.setattr(tinymodel, "CHAT_TEMPLATE", template)
        files[name] = tinymodel.write(root / f"{name}.gguf")
    with started(root) as node:
        register(node, files)
        yield root / "run" / "io.syntrop.Runtime1"


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _chat(socket_path: Path, model: str) -> dict[str, Any]:
    """Runtime1.Chat over raw Varlink: the last reply."""
    with connect(socket_path, timeout=30) as sock:
        sock.sendall(encode("io.syntrop.Runtime1.Chat", {
            "model": model, "messages": [{"role": "user", "content": "Hi"}],
            "sampling": {"max_tokens": 1}}, more=True))
        reader = Reader(sock)
        last: dict[str, Any] = {}
        while (reply := reader.next()) is not None:
            last = reply
            if not reply.get("continues"):
                break
    return last


@pytest.mark.parametrize("model", sorted(TEMPLATES))
def test_a_hostile_chat_template_is_a_declared_error_and_runtimed_serves_on(
    runtime: Path, model: str
) -> None:
    """Chat template server-side template injection (CVE-2024-34359 class)
    through a stored model's metadata, end to end."""
    start = time.monotonic()
    answer = _chat(runtime, model)
    assert answer.get("error") == "io.syntrop.Runtime1.InvalidModel", answer
    assert "chat template" in answer["parameters"]["reason"], answer
    assert "uid=" not in str(answer) and "<class" not in str(answer), answer
    assert time.monotonic() - start < 10
    assert "error" not in _chat(runtime, "smollm2")
