"""Which CPU code the engine runs: chosen at run time, on the host it runs on.

scripts/build-engine builds llama.cpp's CPU backend once per feature level
that pays (libggml-cpu-x64.so … libggml-cpu-cascadelake.so; older wheels
had more, up to libggml-cpu-sapphirerapids.so) next to libggml.so in
llama_cpp/lib. llama.cpp finds none of them by itself, so runtimed picks
the variant (and the wheel's own import loads that one, named in
$SYNTROP_CPU_BACKEND, or ggml's best: scripts/build-engine's AUTOLOAD):

1. `probe()` runs a child process (`python -m syntrop.runtimed.cpu probe`)
   that opens each variant and asks it for its score (ggml_backend_score:
   0 when this CPU lacks a feature it was compiled for, else higher for
   more features), and, where /proc/cpuinfo advertises AMX, tests AMX for
   real in a grandchild: it asks the kernel for the tile data state
   (arch_prctl ARCH_REQ_XCOMP_PERM) and executes ldtilecfg, tilezero and
   tilerelease with the palette llama.cpp uses. Some hosts advertise AMX
   and then fault on ldtilecfg (virtual machines whose CPUID says more than
   the hypervisor grants): there, the grandchild dies, not runtimed.
2. `choose()` takes the best-scoring variant, leaving out the AMX ones:
   even where the probe's own tile code runs, llama.cpp's AMX kernels die
   with SIGILL on their first tilezero (seen on an Intel Xeon with
   amx_tile, amx_int8 and amx_bf16); the probe's verdict is reported.
3. Each engine worker calls `ready()` with runtimed's choice before its
   first model: it loads that variant (ggml_backend_load). Anything else
   that uses llama_cpp in-process (`runtimed verify`, benchmarks, tests)
   calls `ready()` too, which probes and chooses the same way.

A llama-cpp-python built the default way (one native CPU backend linked
in, no variants) still runs: there is nothing to choose, and where AMX is
advertised, `activate()` turns off llama.cpp's extra buffer types (the
AMX weight layout is one of them), which keeps it off the AMX path.

`python -m syntrop.runtimed.cpu` (or `runtimed engine`) prints what was
found and chosen. Nothing here imports llama_cpp except `activate()`.
"""

import ctypes
import importlib.util
import json
import logging
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Variants whose code uses AMX tiles (ggml's CPU_ALL_VARIANTS names).
#: Never chosen: on a Xeon whose AMX passes the probe (the tile data
#: granted, ldtilecfg and tilezero run), llama.cpp's AMX kernels still die
#: with SIGILL on their first tilezero (a tile its thread never
#: configured), so a host advertising AMX runs its best AVX-512 variant.
AMX_VARIANTS = frozenset({"sapphirerapids"})
AMX_REFUSED = "llama.cpp's AMX kernels fault here even where AMX works"
#: A variant module: libggml-cpu-<name>.so.
VARIANT = re.compile(r"^libggml-cpu-(?P<name>[A-Za-z0-9_.]+)\.so$")
#: Seconds the probe may take (it opens ~14 small libraries).
PROBE_TIMEOUT = 30.0

# arch_prctl(2) and the x86 state components of AMX.
SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
#: ldtilecfg [rdi]; tilezero tmm0; tilerelease; ret
AMX_CODE = bytes.fromhex("c4e2784907" "c4e27b49c0" "c4e27849c0" "c3")


@dataclass(frozen=True, slots=True, kw_only=True)
class Amx:
    """AMX on this host, as seen by a process of ours."""

    #: /proc/cpuinfo lists amx_tile and amx_int8.
    advertised: bool = False
    #: The kernel granted the tile data state (ARCH_REQ_XCOMP_PERM).
    permitted: bool = False
    #: Tile instructions ran in a child without faulting.
    works: bool = False
    detail: str = "not advertised"


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """What the engine's workers run, and why."""

    #: "variants" (a CPU backend per feature level, chosen here) or
    #: "single" (one CPU backend linked in: nothing to choose).
    build: str
    lib: str
    cpu: str
    amx: Amx
    #: Each variant's score on this CPU (0: unsupported).
    scores: dict[str, int] = field(default_factory=dict)
    #: The variant chosen (build "variants"), or None.
    variant: str | None = None
    #: Whether llama.cpp may use its extra buffer types (weight repacking,
    #: AMX): off for a single build on a host whose AMX faults.
    extra_bufts: bool = True
    reason: str = ""

    @property
    def path(self) -> str | None:
        """The variant's module, for ggml_backend_load."""
        if self.variant is None:
            return None
        return str(Path(self.lib) / f"libggml-cpu-{self.variant}.so")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Choice":
        data = json.loads(text)
        data["amx"] = Amx(**data["amx"])
        return cls(**data)

    def describe(self) -> str:
        """One line for the log."""
        if self.build == "variants":
            where = f"CPU backend {self.variant} (of {len(self.scores)} variants)"
        else:
            where = "the CPU backend linked into llama.cpp (no variants to choose from)"
        bufts = "" if self.extra_bufts else ", extra buffer types off"
        return f"engine on {self.cpu}: {where}; AMX {self.amx.detail}{bufts}"


def lib_dir() -> Path | None:
    """llama_cpp's library folder, found without importing llama_cpp."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def variants(lib: Path) -> dict[str, Path]:
    """The CPU backend variants in `lib`, by name."""
    try:
        entries = sorted(os.listdir(lib))
    except OSError:
        return {}
    return {m["name"]: lib / entry for entry in entries if (m := VARIANT.match(entry))}


def cpu_name(cpuinfo: str) -> str:
    match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else "an unknown CPU"


def amx_advertised(cpuinfo: str) -> bool:
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    flags = set(match.group(1).split()) if match else set()
    return {"amx_tile", "amx_int8"} <= flags


def choose(scores: dict[str, int], amx_works: bool) -> str | None:
    """The best variant this CPU supports; AMX ones only where AMX works.
    Ties go to the name that sorts last, so the choice is stable."""
    usable = {name: score for name, score in scores.items()
              if score > 0 and (amx_works or name not in AMX_VARIANTS)}
    if not usable:
        return None
    return max(usable, key=lambda name: (usable[name], name))


def plane_threads() -> int:
    """Threads for a context: every CPU this process may run on (its
    affinity, i.e. the plane's cores as the worker's cgroup and pinning
    give them). Never a load average: a worker lives long, and a count
    frozen by a busy minute at its start halved every prompt it served
    after. Concurrent generations share these cores through the slot
    layout (layout.Pace), step by step."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def decide(lib: Path | None, cpuinfo: str, probed: dict[str, Any] | None) -> Choice:
    """The choice for a host, from what the probe child reported (None:
    the probe failed or did not run)."""
    cpu = cpu_name(cpuinfo)
    found = variants(lib) if lib is not None else {}
    advertised = amx_advertised(cpuinfo)
    amx = Amx(**probed["amx"]) if probed else Amx(
        advertised=advertised, detail="advertised, not probed" if advertised
        else "not advertised")
    if not found:
        # One CPU backend linked in (pip's default build): keep it off the
        # AMX path wherever AMX is advertised (see AMX_VARIANTS).
        off = amx.advertised
        return Choice(build="single", lib=str(lib or ""), cpu=cpu, amx=amx, extra_bufts=not off,
                      reason="llama-cpp-python was built with one CPU backend "
                             "(scripts/build-engine builds one per feature level)")
    scores = {name: int(score) for name, score in (probed or {}).get("scores", {}).items()}
    if not scores:
        # No scores (the probe failed): the baseline variant runs anywhere.
        name = "x64" if "x64" in found else sorted(found)[0]
        return Choice(build="variants", lib=str(lib), cpu=cpu, amx=amx, variant=name,
                      scores={n: 0 for n in found},
                      reason="the probe failed; the baseline variant runs on any CPU")
    chosen = choose(scores, False)
    if chosen is None:
        name = "x64" if "x64" in found else sorted(found)[0]
        return Choice(build="variants", lib=str(lib), cpu=cpu, amx=amx, variant=name,
                      scores=scores, reason="no variant scored above 0")
    best = choose(scores, True)
    reason = f"highest score ({scores[chosen]})"
    if best != chosen:
        reason += f"; {best} left out: {AMX_REFUSED} (AMX {amx.detail})"
    return Choice(build="variants", lib=str(lib), cpu=cpu, amx=amx, variant=chosen,
                  scores=scores, reason=reason)


def probe(lib: Path | None = None, *, force_amx: bool = False,
          timeout: float = PROBE_TIMEOUT) -> Choice:
    """Probe this host in a child process and choose (blocking, ~50 ms)."""
    lib = lib if lib is not None else lib_dir()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    command = [sys.executable, "-m", "syntrop.runtimed.cpu", "probe", str(lib or "")]
    if force_amx:
        command.append("--force-amx")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
        probed = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        probed = None
    return decide(lib, cpuinfo, probed)


_ready: Choice | None = None
_ready_lock = threading.Lock()


def ready(choice: Choice | None = None) -> Choice:
    """Make llama.cpp usable in this process, once: activate `choice`, or
    what `probe()` chooses. Every user of llama_cpp calls it first (the
    engine does in `Engine.load`); later calls return the first choice."""
    global _ready
    with _ready_lock:
        if _ready is None:
            chosen = choice if choice is not None else probe()
            activate(chosen)
            _ready = chosen
        return _ready


def activate(choice: Choice) -> None:
    """In an engine worker, before its first model: load the chosen CPU
    backend, or keep a single build off the AMX path. Raises OSError when
    the variant cannot be loaded."""
    if choice.path is not None:
        # The engine wheel scripts/build-engine makes loads this one itself
        # on import (unless a CPU backend is loaded already).
        os.environ["SYNTROP_CPU_BACKEND"] = choice.path
    import llama_cpp

    if choice.build == "variants":
        assert choice.path is not None
        loaded = _loaded_cpu_backends()
        if loaded:  # never a second CPU backend: llama.cpp would use both
            if os.path.realpath(choice.path) not in loaded:
                logger.warning("CPU backend %s was loaded before %s could be",
                               ", ".join(sorted(loaded)), choice.path)
            return
        ggml = ctypes.CDLL(_loaded_ggml() or str(Path(choice.lib) / "libggml.so"))
        ggml.ggml_backend_load.restype = ctypes.c_void_p
        ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
        if not ggml.ggml_backend_load(choice.path.encode()):
            raise OSError(f"ggml_backend_load({choice.path}) failed")
    elif not choice.extra_bufts:
        # llama-cpp-python's Llama() takes its model parameters from this
        # function and has no argument for the field.
        defaults = llama_cpp.llama_model_default_params

        def without_extra_bufts() -> Any:
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_model_default_params = without_extra_bufts
        llama_cpp.llama_cpp.llama_model_default_params = without_extra_bufts


def _loaded_cpu_backends() -> set[str]:
    """The CPU backend variants loaded in this process now."""
    try:
        with open("/proc/self/maps") as maps:
            return {os.path.realpath(path) for line in maps
                    if VARIANT.match(os.path.basename(path := line.split()[-1]))}
    except OSError:
        return set()


def _loaded_ggml() -> str | None:
    """The libggml that libllama was linked against, as loaded now. A wheel
    holds copies, not links (libggml.so, libggml.so.0, …): opening another
    copy would load a second ggml with a backend registry of its own, which
    llama.cpp would never see."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libggml.so" in line}
    except OSError:
        return None
    found = sorted(p for p in paths if re.fullmatch(r"libggml\.so(\.\d+)*", os.path.basename(p)))
    return found[0] if found else None


# --- the probe child ---------------------------------------------------------

def _scores(lib: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for name, path in variants(lib).items():
        try:
            module = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
            score = module.ggml_backend_score
        except (OSError, AttributeError):
            found[name] = 0
            continue
        score.restype = ctypes.c_int
        found[name] = int(score())
    return found


def _amx_instructions() -> None:
    """Run ldtilecfg/tilezero/tilerelease (llama.cpp's palette 1; tile 0 of
    16 rows x 64 bytes). Faults where AMX does not really work. The code is
    mapped read+execute from a memfd: no writable and executable mapping,
    so MemoryDenyWriteExecute= allows it."""
    config = (ctypes.c_uint8 * 64)()
    config[0] = 1                                          # palette
    ctypes.c_uint16.from_buffer(config, 16).value = 64     # colsb[0]
    config[48] = 16                                        # rows[0]
    fd = os.memfd_create("syntrop-amx-probe")
    try:
        os.write(fd, AMX_CODE)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        address = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC,
                            mmap.MAP_PRIVATE, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of the probe code")
    finally:
        os.close(fd)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)(ctypes.addressof(config))


def _amx(force: bool) -> Amx:
    try:
        advertised = amx_advertised(Path("/proc/cpuinfo").read_text())
    except OSError:
        advertised = False
    if not advertised and not force:
        return Amx()
    libc = ctypes.CDLL(None, use_errno=True)
    permitted = libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    errno = ctypes.get_errno()
    pid = os.fork()
    if pid == 0:  # the grandchild: fault here, if anywhere
        try:
            _amx_instructions()
        except BaseException:
            os._exit(2)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    seen = "advertised" if advertised else "not advertised (probed anyway)"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        fault = f"{signal.Signals(number).name}" if number in signal.valid_signals() \
            else f"signal {number}"
        return Amx(advertised=advertised, permitted=permitted, works=False,
                   detail=f"{seen} but faults ({fault} on ldtilecfg)"
                   + ("" if permitted else f"; XTILEDATA refused: {os.strerror(errno)}"))
    if os.WEXITSTATUS(status) != 0:
        return Amx(advertised=advertised, permitted=permitted, works=False,
                   detail=f"{seen} but the probe could not run its code")
    if not permitted:
        return Amx(advertised=advertised, permitted=False, works=False,
                   detail=f"{seen} but XTILEDATA refused: {os.strerror(errno)}")
    return Amx(advertised=advertised, permitted=True, works=True, detail="works")


def _probe_main(argv: list[str]) -> int:
    lib = Path(argv[0]) if argv and argv[0] else None
    force = "--force-amx" in argv
    result = {"scores": _scores(lib) if lib is not None else {}, "amx": asdict(_amx(force))}
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`runtimed engine [--json] [--force-amx]`: the choice, printed."""
    argv = sys.argv[1:] if argv is None else argv
    unknown = [a for a in argv if a not in ("--json", "--force-amx")]
    if unknown and argv[:1] != ["probe"]:
        print(f"runtimed engine: unknown argument {unknown[0]!r} "
              "(usage: runtimed engine [--json] [--force-amx])", file=sys.stderr)
        return 2
    if argv[:1] == ["probe"]:
        return _probe_main(argv[1:])
    choice = probe(force_amx="--force-amx" in argv)
    if "--json" in argv:
        print(choice.to_json())
        return 0
    print(choice.describe())
    print(f"build: {choice.build} ({choice.lib or 'llama_cpp not found'})")
    if choice.reason:
        print(f"why: {choice.reason}")
    for name, score in sorted(choice.scores.items(), key=lambda item: -item[1]):
        mark = "*" if name == choice.variant else " "
        print(f" {mark} {name:16} score {score}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`
        sys.exit(0)
