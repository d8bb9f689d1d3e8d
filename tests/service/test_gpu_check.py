"""scripts/gpu-check --dry-run: the GPU check's whole flow on the CPU. A
real inferenced (socket-activated by the script) scans a fake sysfs tree
holding one NVIDIA GPU, leases it, runtimed's placement code places a
random-weight model in SmolLM2-135M's shape on that lease, and the model is
loaded with those settings but n_gpu_layers 0 and measured. The script runs
as `make test` and a user run it: a process of its own."""

import json
import subprocess
import sys
from pathlib import Path

from tests.models import require_llama
from tests.support import REPO

require_llama()

SCRIPT = REPO / "scripts" / "gpu-check"


def test_dry_run_leases_places_and_measures_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert result["gpu_tokens_per_s"] is None
    assert result["cpu_tokens_per_s"]["prefill"] > 0
    assert result["cpu_tokens_per_s"]["decode"] > 0
    assert result["lease_id"]
    assert result["device"]
    assert result["plane"]["kind"] == "drm_gpu" and result["plane"]["id"] == "drm-renderD128"
    assert result["placement"]["n_gpu_layers"] == 0
    # What the lease gives: the whole model on the (fake) GPU.
    assert result["placement_from_lease"]["n_gpu_layers"] == result["model"]["n_layer"] + 1
    assert result["model"]["shape"] == "SmolLM2-135M"
    assert result["lease_bytes"] >= result["model"]["bytes"]


def test_without_a_gpu_it_says_so_and_points_at_the_dry_run(tmp_path: Path) -> None:
    if any(Path("/dev").glob("nvidia[0-9]*")):
        import pytest

        pytest.skip("an NVIDIA GPU is here")
    done = subprocess.run([sys.executable, str(SCRIPT), "--from", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stdout == ""
    line, = done.stderr.strip().splitlines()
    assert line.startswith("gpu-check: no NVIDIA GPU here") and "--dry-run" in line
