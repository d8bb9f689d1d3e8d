"""scripts/gpu-check --prepare repacks llama-cpp-python's sdist without
what its build never reads: the rule, and a repack of a small fake sdist."""

import io
import tarfile
from pathlib import Path

import pytest

from tests.support import load_script

gpu_check = load_script("gpu-check")


@pytest.mark.parametrize("path", [
    "CMakeLists.txt", "pyproject.toml", "README.md", "LICENSE.md", "llama_cpp/llama.py",
    "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu",
    "vendor/llama.cpp/ggml/src/ggml-vulkan/CMakeLists.txt",
    "vendor/llama.cpp/src/llama.cpp", "vendor/llama.cpp/common/common.cpp",
    "vendor/llama.cpp/cmake/build-info.cmake", "vendor/llama.cpp/include/llama.h",
    "vendor/llama.cpp/vendor/nlohmann/json.hpp", "vendor/llama.cpp/licenses/LICENSE-curl",
    "vendor/llama.cpp/tools/mtmd/CMakeLists.txt", "vendor/llama.cpp/tools/mtmd/models/models.h",
    "vendor/llama.cpp/tools/mtmd", "vendor/llama.cpp/ggml/src/ggml-cpu/tests.c",
    "docs2/x", "vendor/llama.cpp/modelsx",
])
def test_what_the_build_reads_is_kept(path: str) -> None:
    assert not gpu_check.pruned(path)


@pytest.mark.parametrize("path", [
    ".git", ".git/objects/ab", ".gitignore", ".github/workflows/ci.yml", "docs/index.md",
    "examples/chat.py", "tests/test_llama.py", "docker/Dockerfile",
    "vendor/llama.cpp/.git", "vendor/llama.cpp/.gitmodules", "vendor/llama.cpp/models",
    "vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf", "vendor/llama.cpp/docs/build.md",
    "vendor/llama.cpp/tests/test-backend-ops.cpp", "vendor/llama.cpp/examples/simple/a.cpp",
    "vendor/llama.cpp/tools/server/server.cpp", "vendor/llama.cpp/tools/ui/index.html",
    "vendor/llama.cpp/tools", "vendor/llama.cpp/media/llama.png",
    "vendor/llama.cpp/gguf-py/gguf/gguf.py", "vendor/llama.cpp/benches/x",
])
def test_what_it_never_reads_is_pruned(path: str) -> None:
    assert gpu_check.pruned(path)


def test_repack_keeps_names_and_contents(tmp_path: Path) -> None:
    sdist = tmp_path / "src" / "llama_cpp_python-0.0.1.tar.gz"
    sdist.parent.mkdir()
    files = {"CMakeLists.txt": b"project(x)\n", "vendor/llama.cpp/models/big.gguf": b"x" * 4096,
             "vendor/llama.cpp/src/llama.cpp": b"int main;\n", ".git/HEAD": b"ref\n"}
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"llama_cpp_python-0.0.1/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    out.mkdir()
    target, kept, dropped = gpu_check.repack(sdist, out)
    assert target.name == sdist.name and (kept, dropped) == (2, 2)
    with tarfile.open(target) as tar:
        names = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert names == {"llama_cpp_python-0.0.1/CMakeLists.txt": b"project(x)\n",
                     "llama_cpp_python-0.0.1/vendor/llama.cpp/src/llama.cpp": b"int main;\n"}
