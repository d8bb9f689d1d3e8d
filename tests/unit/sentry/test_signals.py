"""How systemd's signals become failures to triage (service.py): one per
change into failed, however often systemd repeats the unit's properties."""

import asyncio
from pathlib import Path

import pytest

from syntrop.config import Paths
from syntrop.sentry.config import Config
from syntrop.sentry.service import SentryService
from syntrop.sentry.supervisor import Signal
from syntrop.system.systemd import JobResult


def test_one_failure_is_offered_once_a_new_one_again(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> list[tuple[str, str]]:
        paths = Paths(runtime=tmp_path, state=tmp_path, cache=tmp_path,
                      configuration=tmp_path)
        service = SentryService(paths, config=Config())
        offered: list[tuple[str, str]] = []

        def offer(signal: Signal) -> bool:
            offered.append((signal.unit, signal.trigger))
            return True

        monkeypatch.setattr(service.supervisor, "offer", offer)
        for state in ("active", "failed", "failed", "failed"):  # Result, timestamps, …
            service._state("a.service", state)
        service._state("b.service", "failed")  # first seen failed: a failure
        for state in ("activating", "failed"):  # started again by hand, failed again
            service._state("a.service", state)
        service._job(JobResult(job="/j/1", unit="c.service", result="dependency"))
        service._job(JobResult(job="/j/2", unit="c.service", result="done"))
        await service.aclose()
        return offered

    assert asyncio.run(scenario()) == [("a.service", "state_failed"),
                                       ("b.service", "state_failed"),
                                       ("a.service", "state_failed"),
                                       ("c.service", "job_dependency")]
