"""runtimed stays up on idle while an idle model's keep-alive runs, and
exits once none is left to wait for."""

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from syntrop.config import Paths
from syntrop.runtimed.config import Config
from syntrop.runtimed.residency import Resident
from syntrop.runtimed.service import RuntimeService
from syntrop.varlink.daemon import _answering


def service(tmp_path: Path, keep_alive: float = 300.0) -> RuntimeService:
    paths = Paths(runtime=tmp_path / "run", state=tmp_path / "state", cache=tmp_path / "cache",
                  configuration=tmp_path / "config")
    return RuntimeService(paths, replace(Config(), keep_alive=keep_alive))


def resident(idle_for: float) -> Resident:
    worker: Any = object()  # keep_alive never touches the worker
    return Resident(name="m", digest="0" * 64, size=1, worker=worker,
                    last_used=time.monotonic() - idle_for)


def test_no_model_lets_it_exit(tmp_path: Path) -> None:
    assert not service(tmp_path).keep_alive()


def test_idle_model_within_its_keep_alive_keeps_it(tmp_path: Path) -> None:
    runtime = service(tmp_path)
    runtime.models["m"] = resident(idle_for=31.0)  # past the 30 s idle exit
    assert runtime.keep_alive()


def test_spent_keep_alive_lets_it_exit(tmp_path: Path) -> None:
    runtime = service(tmp_path, keep_alive=10.0)
    runtime.models["m"] = resident(idle_for=11.0)  # the sweep unloads it, or failed to
    assert not runtime.keep_alive()


def test_model_held_only_by_a_session_lets_it_exit(tmp_path: Path) -> None:
    runtime = service(tmp_path)
    runtime.models["m"] = held = resident(idle_for=0.0)
    runtime.residency.in_use = lambda r: r is held
    assert not runtime.keep_alive()


def test_a_failing_keep_alive_answers_no() -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    answer = _answering(broken)
    assert answer is not None and answer() is False
    assert _answering(None) is None
