"""The differential oracle against llama.cpp on real files: the tiny model
in every stored type, over a sequence of its whole vocabulary, and the first
tokens of SmolLM2; a deliberately wrong forward pass is caught; and the
`runtimed verify` command's exit codes and messages, on a file and on a
model named in a running modeld (its descriptor over the real socket)."""

import asyncio
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from syntrop.interfaces.model import Model1
from syntrop.runtimed.oracle import forward
from syntrop.runtimed.oracle.compare import format_report, verify
from syntrop.runtimed.oracle.weights import Config
from syntrop.varlink.client import connect
from tests import tinymodel
from tests.models import require_llama, smollm2
from tests.support import activated

require_llama()
#: llama.cpp runs in this process: in a child pytest of its own (tests/isolation.py).
pytestmark = pytest.mark.isolated

VOCAB = list(range(len(tinymodel.vocabulary()[0])))


@pytest.mark.parametrize("qtype", tinymodel.QTYPES)
def test_tiny_model_agrees_on_every_token(tmp_path_factory: pytest.TempPathFactory,
                                          qtype: str) -> None:
    report = verify(tinymodel.build(tmp_path_factory, qtype), VOCAB, threads=2)
    assert report.ok, format_report(report, verbose=True)
    assert len(report.positions) == len(VOCAB)
    assert report.top1_checked >= len(VOCAB) // 2
    if qtype in ("F32", "F16"):
        assert report.tolerance == 0.01 and report.max_relative < 0.005


def test_smollm2_first_tokens_agree() -> None:
    report = verify(smollm2(), count=16, threads=2)
    assert report.ok, format_report(report, verbose=True)
    assert len(report.tokens) == 16 and report.types.get("Q4_1")
    assert report.top1_checked >= 4


@pytest.mark.parametrize("qtype", ["F32", "Q4_K"])
@pytest.mark.parametrize("bug", ["rope", "heads"])
def test_a_wrong_forward_pass_disagrees(tmp_path_factory: pytest.TempPathFactory,
                                        monkeypatch: pytest.MonkeyPatch, qtype: str,
                                        bug: str) -> None:
    right_rope = forward.rope

    def reordered_rope(x: np.ndarray, positions: np.ndarray, config: Config) -> np.ndarray:
        # rotate (i, i + n_rot/2) pairs instead of adjacent ones
        n = config.n_rot
        order = np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)])
        inverse = np.argsort(order)
        y = x.copy()
        y[..., :n] = x[..., :n][..., inverse]
        out = right_rope(y, positions, config)
        out[..., :n] = out[..., :n][..., order]
        return out

    def tiled(x: np.ndarray, config: Config) -> np.ndarray:
        # query head j reading KV head j % n_kv instead of j // group
        return np.concatenate([x] * (config.n_head // config.n_head_kv), axis=1)

    monkeypatch.setattr(forward, *(("rope", reordered_rope) if bug == "rope"
                                   else ("expand_kv", tiled)))
    report = verify(tinymodel.build(tmp_path_factory, qtype), VOCAB[:64], threads=2)
    assert not report.ok
    assert report.max_relative > 5 * report.tolerance


def runtimed(*args: str, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syntrop.runtimed", *args],
                          capture_output=True, text=True, timeout=300, check=False, env=env)


def test_verify_a_model_by_its_name_in_modeld(tmp_path_factory: pytest.TempPathFactory,
                                              tmp_path: Path) -> None:
    tiny = tinymodel.build(tmp_path_factory, "Q4_0")
    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path / "run")}
    with activated("modeld", tmp_path) as modeld:
        async def register() -> None:
            async with await connect(Model1, address=modeld.address,
                                     timeout=60) as client:
                await client.Register(name="tiny", path=str(tiny), sha256=digest)
        asyncio.run(register())
        done = runtimed("verify", "tiny", "--tokens", "8", env=env)
        assert done.returncode == 0, done.stderr
        assert f"tiny: modeld's sha256:{digest}" in done.stdout
        assert done.stdout.splitlines()[-1] == "agree"
        done = runtimed("verify", "missing", env=env)
        assert done.returncode == 2 and "modeld has no model of that name" in done.stderr
    done = runtimed("verify", "tiny", env=env)
    assert done.returncode == 2 and "modeld cannot be reached" in done.stderr
    assert "Traceback" not in done.stderr


def test_verify_command(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    tiny = tinymodel.build(tmp_path_factory, "Q8_0")
    done = runtimed("verify", str(tiny), "--all-tokens", "--threads", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "agree"
    assert "380 tokens" in done.stdout
    done = runtimed("verify", str(tiny), "--tokens", "8", "--tolerance", "1e-12", "-v")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "DISAGREE"
    assert len([line for line in done.stdout.splitlines() if line.startswith("  ")]) == 9


def test_verify_command_bad_input(tmp_path: Path) -> None:
    done = runtimed("verify", str(tmp_path / "missing.gguf"))
    assert done.returncode == 2 and "no such file" in done.stderr
    assert "Traceback" not in done.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 10)
    done = runtimed("verify", str(junk))
    assert done.returncode == 2 and str(junk) in done.stderr
    assert "Traceback" not in done.stderr
    done = runtimed("verify")
    assert done.returncode == 2 and "usage: runtimed verify" in done.stderr
    done = runtimed("verify", str(junk), "--tokens", "0")
    assert done.returncode == 2 and "--tokens" in done.stderr


def test_runtimed_without_verify_is_the_daemon() -> None:
    done = runtimed("--help")
    assert done.returncode == 0 and "--idle-timeout" in done.stdout
