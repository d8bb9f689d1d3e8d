"""scripts/build-engine cuts ggml's x86-64 CPU variants to the ones it keeps,
and fails, saying so, where llama.cpp's list is not the one it knows."""


import pytest

from tests.support import load_script

build_engine = load_script("build-engine")


def _cmake(names: tuple[str, ...]) -> str:
    """A CMakeLists.txt shaped like ggml's: x86 variants, then Arm ones."""
    x86 = "\n".join(f"        ggml_add_cpu_backend_variant({name:<18} SSE42 AVX)"
                    for name in names)
    return ("function(ggml_add_cpu_backend_variant tag_name)\nendfunction()\n"
            'if (GGML_SYSTEM_ARCH STREQUAL "x86")\n'
            f"{x86}\n"
            'elseif(GGML_SYSTEM_ARCH STREQUAL "ARM")\n'
            "            ggml_add_cpu_backend_variant(armv8.0_1)\n"
            "            ggml_add_cpu_backend_variant(armv8.2_1    DOTPROD)\n"
            "endif()\n")


def _built(cmake: str) -> list[str]:
    return [line.split("(")[1].split()[0].rstrip(")") for line in cmake.splitlines()
            if line.strip().startswith("ggml_add_cpu_backend_variant(")]


def test_only_the_kept_x86_variants_are_left_and_the_rest_untouched() -> None:
    original = _cmake(build_engine.GGML_X86_64_VARIANTS)
    cut = build_engine.keep_variants(original, ("x64", "haswell", "zen4"))
    assert _built(cut) == ["x64", "haswell", "zen4", "armv8.0_1", "armv8.2_1"]
    assert "# syntrop: not built: ggml_add_cpu_backend_variant(sapphirerapids" in cut
    assert "function(ggml_add_cpu_backend_variant tag_name)" in cut
    assert len(cut.splitlines()) == len(original.splitlines())


def test_the_kept_variants_are_all_in_ggml_list() -> None:
    assert set(build_engine.X86_64_VARIANTS) <= set(build_engine.GGML_X86_64_VARIANTS)
    assert "x64" in build_engine.X86_64_VARIANTS  # every x86-64 host runs one
    assert "sapphirerapids" not in build_engine.X86_64_VARIANTS  # never loaded


def test_a_changed_list_in_llama_cpp_fails_the_build(capsys: pytest.CaptureFixture[str]) -> None:
    changed = _cmake(tuple(n for n in build_engine.GGML_X86_64_VARIANTS if n != "icelake"))
    with pytest.raises(SystemExit) as stopped:
        build_engine.keep_variants(changed, build_engine.X86_64_VARIANTS)
    assert stopped.value.code == 1
    assert "x86-64 CPU variants are not the ones known here" in capsys.readouterr().err

