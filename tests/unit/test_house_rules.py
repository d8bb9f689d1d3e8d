"""The house rules of docs/ARCHITECTURE.md, checked on the source rather than
trusted: every import of every module under src/syntrop, lazy ones inside
functions included, read with ast.

- no daemon package imports another daemon's package (they talk through
  the contracts in syntrop.interfaces and the bus);
- no daemon package imports httpx (routerd's HTTP is its own, on httptools, in a 32 MiB daemon;
  pulls are the syn command's: syntrop.pull);
- no daemon imports syn pull's client side (syntrop.pull) or the CLIs;
- shared modules (interfaces, varlink, system, config, modelfile, prefix) import no
  daemon and no CLI;
- runtimed's two processes stay apart: nothing under runtimed/worker/
  imports the face (service, supervisor, seats, residency, ...), the face
  reaches worker/ only through protocol.py, and the few modules both
  import (RUNTIMED_SHARED) import neither side;
- runtimed's worker speaks only protocol.py: nothing under runtimed/worker/
  imports the Varlink layer (syntrop.varlink) or the contracts
  (syntrop.interfaces); its failures are protocol.Kind, which the face
  turns into Runtime1 errors.
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
    would pass on nothing): routerd's httptools, syn's lazy pull imports."""
    seen = imports()
    assert any(p == "routerd" and m == "httptools" for p, m, _ in seen)
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


def module_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the syntrop modules it imports (lazy and TYPE_CHECKING
    imports included: a cycle that only type checking or a function closes
    is still two modules that cannot be understood apart)."""
    def name_of(path: Path) -> str:
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(path): path for path in root.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # from package import submodule: the submodule, when it is one
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                target = resolve(name) if name.startswith("syntrop") else None
                if target is not None and target != module:
                    edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected sets of more than one module
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    assert cycles(module_graph()) == []


def test_a_new_cycle_or_crossing_would_be_seen(tmp_path: Path) -> None:
    """The checks above fail on what they forbid: a small tree with a
    cycle, and the reader on it."""
    root = tmp_path / "syntrop"
    (root / "a").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a" / "__init__.py").write_text("")
    (root / "a" / "x.py").write_text("from syntrop.a import y\n")
    (root / "a" / "y.py").write_text("def f():\n    from syntrop.a.x import g\n")
    (root / "a" / "z.py").write_text("import syntrop.a.y\n")
    assert cycles(module_graph(root)) == [["syntrop.a.x", "syntrop.a.y"]]


RUNTIMED = "syntrop.runtimed"
WORKER = "syntrop.runtimed.worker"
#: What both of runtimed's processes import: the messages (protocol), the
#: socket's framing (channel), and pure leaf modules: the CPU choice, the
#: pace board, sampling checks, session digests, constraint compiling (the
#: face compiles, the worker guides) and the journal.
RUNTIMED_SHARED = frozenset(f"{RUNTIMED}.{name}" for name in (
    "protocol", "channel", "cpu", "layout", "sampling", "sessions", "constrain", "journal"))


def runtimed_crossings(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for each import that crosses runtimed's split."""
    def worker_side(module: str) -> bool:
        return module == WORKER or module.startswith(WORKER + ".")

    wrong = []
    for module, targets in graph.items():
        if not module.startswith(RUNTIMED + "."):
            continue
        for target in targets:
            if not target.startswith(RUNTIMED + ".") or target == module:
                continue
            if module in RUNTIMED_SHARED:
                bad = target not in RUNTIMED_SHARED  # a leaf imports either side
            elif target in RUNTIMED_SHARED:
                bad = False
            else:  # the worker side imports the face, or the face the worker side
                bad = worker_side(module) != worker_side(target)
            if bad:
                wrong.append((module, target))
    return sorted(wrong)


def test_runtimed_face_and_worker_meet_only_in_protocol() -> None:
    graph = module_graph()
    assert WORKER in graph and f"{RUNTIMED}.service" in graph  # the rule sees both sides
    assert runtimed_crossings(graph) == []


def test_a_runtimed_crossing_would_be_seen() -> None:
    graph = {f"{WORKER}.host": {f"{RUNTIMED}.seats", f"{RUNTIMED}.protocol"},
             f"{RUNTIMED}.service": {f"{WORKER}.engine", f"{RUNTIMED}.protocol"},
             f"{RUNTIMED}.protocol": {f"{RUNTIMED}.supervisor"}}
    assert runtimed_crossings(graph) == [
        (f"{RUNTIMED}.protocol", f"{RUNTIMED}.supervisor"),
        (f"{RUNTIMED}.service", f"{WORKER}.engine"),
        (f"{WORKER}.host", f"{RUNTIMED}.seats")]


def worker_contract_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(worker module, imported module) for each import of the Varlink
    layer or the contracts under runtimed/worker/."""
    return sorted((module, target) for module, targets in graph.items()
                  if module == WORKER or module.startswith(WORKER + ".")
                  for target in targets
                  if top(target) in ("varlink", "interfaces"))


def test_runtimed_worker_imports_no_varlink_and_no_contracts() -> None:
    graph = module_graph()
    assert f"{WORKER}.host" in graph  # the rule sees the worker
    assert worker_contract_imports(graph) == []


def test_a_worker_importing_the_contracts_would_be_seen(tmp_path: Path) -> None:
    root = tmp_path / "syntrop"
    worker = root / "runtimed" / "worker"
    (root / "interfaces").mkdir(parents=True)
    worker.mkdir(parents=True)
    for package in (root, root / "interfaces", root / "runtimed", worker):
        (package / "__init__.py").write_text("")
    (root / "interfaces" / "runtime.py").write_text("")
    (root / "varlink.py").write_text("")
    (root / "runtimed" / "protocol.py").write_text("")
    (worker / "host.py").write_text("from syntrop.runtimed.protocol import Kind\n"
                                    "def f():\n    from syntrop.varlink import InvalidParameter\n")
    (worker / "pool.py").write_text("from syntrop.interfaces.runtime import InvalidModel\n")
    assert worker_contract_imports(module_graph(root)) == [
        (f"{WORKER}.host", "syntrop.varlink"),
        (f"{WORKER}.pool", "syntrop.interfaces.runtime")]
