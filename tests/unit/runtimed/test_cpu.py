"""Choosing the engine's CPU code (cpu.py): the pure choice from scores and
what AMX did, for hosts we cannot be on (an Intel VM whose AMX faults, a
host with only the default build), and the real probe on whatever host runs
the test, which must come back whole even when its AMX test faults."""

import json
from pathlib import Path

import pytest

from syntrop.runtimed import cpu

INTEL = ("model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
         "flags\t\t: fpu sse4_2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n")
AMD = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_vnni avx512_bf16\n"
#: Scores as an Intel host with AMX flags gets them (sapphirerapids highest).
SCORES = {"x64": 1, "haswell": 64, "skylakex": 192, "icelake": 1472, "zen4": 1984,
          "sapphirerapids": 4032, "alderlake": 0}
FAULTS = {"advertised": True, "permitted": True, "works": False,
          "detail": "advertised but faults (SIGSEGV on ldtilecfg)"}


def lib_with(tmp_path: Path, names: list[str]) -> Path:
    for name in names:
        (tmp_path / f"libggml-cpu-{name}.so").write_bytes(b"")
    (tmp_path / "libggml.so").write_bytes(b"")
    (tmp_path / "libggml-cpu.so.bak").write_bytes(b"")  # not a variant
    return tmp_path


def test_the_best_variant_leaves_amx_out_unless_it_works() -> None:
    assert cpu.choose(SCORES, amx_works=True) == "sapphirerapids"
    assert cpu.choose(SCORES, amx_works=False) == "zen4"
    assert cpu.choose({"alderlake": 0, "sapphirerapids": 9}, amx_works=False) is None
    assert cpu.choose({}, amx_works=True) is None
    # Ties are broken by name, so the choice does not depend on dict order.
    assert cpu.choose({"b": 5, "a": 5}, amx_works=False) == "b"


def test_an_intel_host_whose_amx_faults_gets_the_best_variant_without_it(tmp_path: Path) -> None:
    lib = lib_with(tmp_path, list(SCORES))
    choice = cpu.decide(lib, INTEL, {"scores": SCORES, "amx": FAULTS})
    assert choice.build == "variants" and choice.variant == "zen4"
    assert choice.path == str(lib / "libggml-cpu-zen4.so")
    assert "sapphirerapids left out" in choice.reason and "faults" in choice.reason
    assert choice.extra_bufts and choice.cpu.startswith("Intel(R) Xeon(R)")
    assert "zen4" in choice.describe() and "faults" in choice.describe()
    # Where the probe's tile code runs, llama.cpp's AMX kernels still die
    # (SIGILL on their first tilezero, seen on a Xeon): never chosen.
    working = dict(FAULTS, works=True, detail="works")
    choice = cpu.decide(lib, INTEL, {"scores": SCORES, "amx": working})
    assert choice.variant == "zen4" and "sapphirerapids left out" in choice.reason


def test_a_single_build_is_kept_off_the_amx_path_where_amx_faults(tmp_path: Path) -> None:
    choice = cpu.decide(tmp_path, INTEL, {"scores": {}, "amx": FAULTS})
    assert choice.build == "single" and choice.variant is None and choice.path is None
    assert not choice.extra_bufts
    working = dict(FAULTS, works=True, detail="works")
    assert not cpu.decide(tmp_path, INTEL, {"scores": {}, "amx": working}).extra_bufts
    quiet = {"advertised": False, "permitted": False, "works": False, "detail": "not advertised"}
    amd = cpu.decide(tmp_path, AMD, {"scores": {}, "amx": quiet})
    assert amd.build == "single" and amd.extra_bufts
    # Without the probe's answer an advertised AMX is not trusted either.
    assert not cpu.decide(tmp_path, INTEL, None).extra_bufts


def test_without_scores_the_baseline_variant_is_chosen(tmp_path: Path) -> None:
    lib = lib_with(tmp_path, ["x64", "zen4"])
    choice = cpu.decide(lib, AMD, None)
    assert choice.variant == "x64" and "probe failed" in choice.reason
    assert sorted(cpu.variants(lib)) == ["x64", "zen4"]


def test_the_choice_survives_json_for_the_workers(tmp_path: Path) -> None:
    lib = lib_with(tmp_path, list(SCORES))
    choice = cpu.decide(lib, INTEL, {"scores": SCORES, "amx": FAULTS})
    again = cpu.Choice.from_json(choice.to_json())
    assert again == choice and isinstance(again.amx, cpu.Amx)
    assert json.loads(choice.to_json())["variant"] == "zen4"


def test_cpuinfo() -> None:
    assert cpu.amx_advertised(INTEL) and not cpu.amx_advertised(AMD)
    assert cpu.cpu_name(AMD) == "AMD EPYC 9R14" and cpu.cpu_name("") == "an unknown CPU"


def test_the_real_probe_comes_back_whole_even_when_amx_faults() -> None:
    """On this host, whatever it is: the AMX test runs in a grandchild (here
    even where AMX is not advertised), and what it reports is consistent."""
    if cpu.lib_dir() is None:
        pytest.skip("llama_cpp is not installed")
    choice = cpu.probe(force_amx=True)
    assert choice.amx.detail
    assert not choice.amx.works or choice.amx.permitted
    if not choice.amx.works:
        assert "faults" in choice.amx.detail or "refused" in choice.amx.detail \
            or "could not" in choice.amx.detail
    if choice.build == "variants":
        assert choice.variant is not None
        allowed = {n: s for n, s in choice.scores.items() if n not in cpu.AMX_VARIANTS}
        assert choice.scores[choice.variant] == max(allowed.values())
        assert choice.scores[choice.variant] > 0


def test_plane_threads_are_every_cpu_of_this_process_whatever_the_load() -> None:
    """A worker takes the CPUs it may run on, not the ones a load average
    calls idle at its start (a frozen 1 thread halved every prompt)."""
    import os

    assert cpu.plane_threads() == len(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(mine)})
        assert cpu.plane_threads() == 1
    finally:
        os.sched_setaffinity(0, mine)
