"""The house rules of docs/ARCHITECTURE.md, checked on the source rather than
trusted: every import of every module under src/syntrop, lazy ones inside
functions included, read with ast.

- no daemon package imports another daemon's package (they talk through
  the contracts in syntrop.interfaces and the bus);
- no daemon package imports httpx (routerd's HTTP is h11 in a 32 MiB daemon;
  pulls are the syn command's: syntrop.pull);
- no daemon imports syn pull's client side (syntrop.pull) or the CLIs;
- shared modules (interfaces, varlink, system, config, modelfile, prefix) import no
  daemon and no CLI.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "syntrop"
DAEMONS = ("inferenced", "modeld", "runtimed", "contextd", "toold", "sentry", "routerd")
SHARED = ("interfaces", "varlink", "system", "config", "modelfile", "prefix")


def imports() -> list[tuple[str, str, int]]:
    """(package of the importing module, imported module, line) for all."""
    found = []
    for path in SRC.rglob("*.py"):
        package = path.relative_to(SRC).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(package, alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((package, node.module, node.lineno))
                if node.module == "syntrop":  # from syntrop import x
                    found += [(package, f"syntrop.{alias.name}", node.lineno)
                              for alias in node.names]
    return found


def top(module: str) -> str | None:
    """The syntrop package a module name is in, e.g. 'routerd'."""
    parts = module.split(".")
    return parts[1] if parts[0] == "syntrop" and len(parts) > 1 else None


def test_the_rules_see_imports() -> None:
    """The reader finds what is known to be there (else the rules below
    would pass on nothing): routerd's h11, syn's lazy pull imports."""
    seen = imports()
    assert any(p == "routerd" and m == "h11" for p, m, _ in seen)
    assert any(p == "cli" and m.startswith("syntrop.pull") for p, m, _ in seen)


def test_no_daemon_imports_another() -> None:
    crossing = [(p, m, n) for p, m, n in imports()
                if p in DAEMONS and top(m) in DAEMONS and top(m) != p]
    assert crossing == []


def test_no_http_client_and_no_client_side_in_a_daemon() -> None:
    wrong = [(p, m, n) for p, m, n in imports() if p in DAEMONS and (
        m.split(".")[0] == "httpx" or top(m) in ("pull", "cli"))]
    assert wrong == []


def test_shared_modules_import_no_daemon_and_no_cli() -> None:
    wrong = [(p, m, n) for p, m, n in imports()
             if p in SHARED and (top(m) in DAEMONS or top(m) in ("cli", "pull"))]
    assert wrong == []
