"""The split between runtimed's face and its engine workers, as imports: the
face never loads llama.cpp, and the worker side never imports the face (so
a worker runs only engine code, and the face's modules stay free to change)."""

import subprocess
import sys

FACE = ("syntrop.runtimed.service", "syntrop.runtimed.residency", "syntrop.runtimed.supervisor",
        "syntrop.runtimed.seats", "syntrop.runtimed.checks", "syntrop.runtimed.streams")


def loaded_after(statement: str, names: tuple[str, ...]) -> list[str]:
    code = f"import sys; {statement}; print(' '.join(n for n in {names!r} if n in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return done.stdout.split()


def test_the_face_never_loads_llama_cpp() -> None:
    assert loaded_after("import syntrop.runtimed.service", ("llama_cpp", "numpy")) == []


def test_the_worker_side_never_imports_the_face() -> None:
    statement = "import syntrop.runtimed.worker.loop, syntrop.runtimed.worker.host"
    assert loaded_after(statement, FACE) == []
