"""modeld for the service tier and the bench: the real daemon under
systemd-socket-activate, the real `syn` command, python-varlink as the
independent client, and a look at the store's files."""

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import varlink

from tests.service.wire import Running, running

NAME = "io.syntrop.Model1"
#: Variables of the caller's environment that must not leak into `syn`.
_SCRUB = ("HF_ENDPOINT", "HF_TOKEN", "SYNTROP_OLLAMA_ENDPOINT", "RUNTIME_DIRECTORY",
          "CONFIGURATION_DIRECTORY", "STATE_DIRECTORY", "CACHE_DIRECTORY")


@dataclass
class Store:
    root: Path
    daemon: Running

    @property
    def directory(self) -> Path:
        return self.root / "state" / "modeld"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        env.update(RUNTIME_DIRECTORY=str(self.root / "run"),
                   CONFIGURATION_DIRECTORY=str(self.root / "cli-config"),
                   PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        env.update(extra)
        return env

    def syn(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        """Run the real `syn` command; stdout and stderr captured."""
        return subprocess.run(
            [sys.executable, "-m", "syntrop.cli.syn", *args], env=self.env(**env),
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def syn_json(self, *args: str, timeout: float = 60, **env: str) -> Any:
        result = self.syn(*args, "--json", timeout=timeout, **env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def call(self, method: str, **params: Any) -> Any:
        with varlink.Client(address=self.daemon.address) as client, client.open(NAME) as proxy:
            return getattr(proxy, method)(**params)

    def call_more(self, method: str, **params: Any) -> list[Any]:
        """A streaming call: every reply."""
        with varlink.Client(address=self.daemon.address) as client, client.open(NAME) as proxy:
            return list(getattr(proxy, method)(_more=True, **params))

    def error(self, method: str, **params: Any) -> tuple[str, dict[str, Any]]:
        try:
            self.call(method, **params)
        except varlink.VarlinkError as error:
            return error.error(), error.parameters()
        raise AssertionError(f"{method} succeeded")

    def visible(self) -> list[str]:
        """Files at final paths: blobs and the by-name tree."""
        found = []
        for top in ("blobs", "by-name"):
            base = self.directory / top
            if base.exists():
                found += [str(p.relative_to(self.directory)) for p in base.rglob("*")
                          if p.is_file()]
        return sorted(found)

    def partials(self) -> list[str]:
        base = self.directory / "partial"
        return sorted(p.name for p in base.iterdir()) if base.exists() else []

    def journal(self) -> dict[str, int]:
        """digest -> durable bytes, read from modeld's database (WAL: readable
        while modeld runs)."""
        import sqlite3

        with contextlib.closing(sqlite3.connect(self.directory / "modeld.db", timeout=5)) as db:
            return dict(db.execute("SELECT digest, durable_bytes FROM partials").fetchall())


def write_config(root: Path, *, modeld: str = "", pull: str = "") -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "modeld.toml").write_text(modeld)
    (root / "cli-config").mkdir(parents=True, exist_ok=True)
    (root / "cli-config" / "pull.toml").write_text(pull)


@contextlib.contextmanager
def modeld(root: Path, *, config: str = "", pull: str = "",
           extra_env: dict[str, str] | None = None) -> Iterator[Store]:
    """modeld, socket-activated and started, with `root` as its world."""
    write_config(root, modeld=config, pull=pull)
    with running("modeld", root, extra_env=extra_env) as daemon:
        yield Store(root, daemon)
