"""Gang triage over real sockets: contextd reads a real journal file
(written by systemd-journal-remote) holding an amdgpu ring timeout and an
AER error in the kernel's real format; inferenced serves a fake four-GPU
sysfs tree (two PCIe switches); sentry, pointed at the same tree, triages the
failed worker: it quarantines exactly the faulty planes through
Inference1.Quarantine, the healthy ones keep serving, and the incident says
which and why. No systemd: the action itself fails, which is not the point
here."""

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from tests import fakesysfs
from tests.service.contextd_node import contextd, journal_remote, kernel, write_journal
from tests.support import Activated, activated

S = 1_000_000
UNIT = "llm-worker.service"
SENTRY = "io.syntrop.Sentry1"
INFERENCE = "io.syntrop.Inference1"

pytestmark = pytest.mark.skipif(journal_remote() is None,
                                reason="systemd-journal-remote missing (Debian: "
                                       "systemd-journal-remote)")


def call(daemon: Activated, interface: str, method: str, **params: Any) -> Any:
    with varlink.Client(address=daemon.address) as client, client.open(interface) as proxy:
        return getattr(proxy, method)(**params)


def worker(ts: int, message: str) -> dict[str, Any]:
    return {"ts": ts, "MESSAGE": message, "PRIORITY": 3, "_SYSTEMD_UNIT": UNIT, "_PID": 4242,
            "SYSLOG_IDENTIFIER": "llm-worker"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Activated]]:
    tree = fakesysfs.four_gpu_box(tmp_path / "tree")
    units = tmp_path / "units"
    units.mkdir()
    (units / UNIT).write_text("[Service]\nExecStart=/usr/bin/llm-worker\n")
    now = time.time_ns() // 1000
    journal = tmp_path / "journal" / "kernel.journal"
    journal.parent.mkdir()
    write_journal(journal, [
        worker(now - 5 * S, "llm-worker: all-reduce on 4 planes"),
        kernel(now - 3 * S, "amdgpu 0000:03:00.0: [drm:amdgpu_job_timedout [amdgpu]] *ERROR* "
                            "ring gfx_0.0.0 timeout, signaled seq=5021, emitted seq=5023"),
        kernel(now - 2 * S, "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!"),
        worker(now - 2 * S, "pcieport 0000:80:01.0: AER: Uncorrected (Fatal) error received: "
                            "0000:80:01.0"),
        worker(now - S, "llm-worker: peer copy 0000:03:00.0 -> 0000:83:00.0 timed out"),
    ])
    root = tmp_path / "root"
    (root / "config").mkdir(parents=True)
    (root / "config" / "inferenced.toml").write_text(f'root = "{tree}"\n')
    (root / "config" / "sentry.toml").write_text(f'sysfs_root = "{tree}"\n')
    with ExitStack() as stack:
        stack.enter_context(contextd(root, [units], journal={
            "journalctl": "journalctl", "files": [str(journal)]}))
        daemons = {
            "inferenced": stack.enter_context(activated("inferenced", root)),
            "sentry": stack.enter_context(activated(
                "systemd-sentry", root,
                extra_env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={root}/no-bus"})),
        }
        yield daemons


def test_gang_triage_quarantines_only_the_faulty_planes(node: dict[str, Activated]) -> None:
    before = call(node["inferenced"], INFERENCE, "GetTopology")["planes"]
    assert {p["id"] for p in before} >= {"drm-renderD128", "drm-renderD131"}
    assert all(p.get("quarantined") is None for p in before)

    incident = call(node["sentry"], SENTRY, "Triage", unit=UNIT)["incident"]
    [phase] = [p for p in incident["phases"] if p["name"] == "gang"]
    assert phase["outcome"] == "ok", phase
    detail = phase["detail"]
    assert detail.startswith("faults: driver_hang, interconnect; serving: drm-renderD129, cpu; "
                             "quarantine drm-renderD128 (driver hang at 0000:03:00.0: amdgpu "
                             "0000:03:00.0: [drm:amdgpu_job_timedout"), detail
    assert "drm-renderD130 (interconnect fault at 0000:80:01.0" in detail
    assert "drm-renderD131 (interconnect fault" in detail

    planes = {p["id"]: p for p in call(node["inferenced"], INFERENCE, "GetTopology")["planes"]}
    quarantined = {plane for plane, p in planes.items() if p.get("quarantined")}
    assert quarantined == {"drm-renderD128", "drm-renderD130", "drm-renderD131"}
    assert planes["drm-renderD128"]["quarantined"].startswith("sentry: driver hang")
    # The healthy GPU keeps serving: a lease on it is granted; the faulty are refused.
    lease = call(node["inferenced"], INFERENCE, "AcquireLease", priority="Batch",
                 memory_bytes=1 << 30, plane="drm-renderD129", unit=None, pid=None)
    assert lease["plane_id"] == "drm-renderD129"
    with pytest.raises(varlink.VarlinkError) as refused:
        call(node["inferenced"], INFERENCE, "AcquireLease", priority="Batch",
             memory_bytes=1 << 30, plane="drm-renderD128", unit=None, pid=None)
    assert refused.value.error() == f"{INFERENCE}.PlaneQuarantined"
    # The rest of the triage still ran: the rules' restart (no systemd here).
    assert incident["decided_by"] == "rules" and incident["result"] == "failed"
