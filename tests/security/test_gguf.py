"""Crafted GGUF files against the parsers that read attacker bytes: the
header reader modeld and runtimed share (syntrop.modelfile), `syn pull` of
a local path into a running modeld (which hashes, then reads the header),
llama.cpp's loader as runtimed's worker calls it, and the chat template
renderer. Each file is refused with a declared error or read cleanly; none
crashes a process, hangs, or leaves anything outside the store."""

import importlib.util
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.security import gguf
from tests.security.hostile import run_capped, timed
from tests.unit.modeld.harness import Store, modeld


def past_eof() -> bytes:
    """GGUF tensor data past EOF (CVE-2025-53630 class): a tensor of 2^20
    floats in a file that holds 64 bytes of data."""
    model = gguf.base()
    model.tensors = [gguf.Tensor("token_embd.weight", (1 << 20,))]
    return model.bytes()


def overflowing_elements() -> bytes:
    """Tensor element counts whose product overflows 64 bits (the ggml GGUF
    parser's integer-overflow advisories, CVE-2025-53630 class): 2^62 x 2^62
    x 16 elements, and a second tensor at an offset of 2^64-1."""
    model = gguf.base()
    model.tensors = [gguf.Tensor("a.weight", (1 << 62, 1 << 62, 16)),
                     gguf.Tensor("b.weight", (16,), offset=(1 << 64) - 1)]
    return model.bytes()


def huge_string() -> bytes:
    """A metadata string whose length is 2^63 (the GGUF header heap-overflow
    advisories: a length trusted for an allocation)."""
    return gguf.base().add_raw("general.name", gguf.STRING, struct.pack("<Q", 1 << 63)).bytes()


def huge_array() -> bytes:
    """An array of 2^40 items (the GGUF header heap-overflow advisories: a
    count trusted for an allocation)."""
    return gguf.base().add_raw("tokenizer.ggml.tokens", gguf.ARRAY,
                               gguf.array(gguf.STRING, 1 << 40, gguf.string("a"))).bytes()


def huge_kv_count() -> bytes:
    """A key/value count of 2^64-1 (same class: a count trusted for a loop
    and an allocation)."""
    model = gguf.base()
    model.kv_count = (1 << 64) - 1
    return model.bytes()


def duplicate_keys() -> bytes:
    """The same key twice, the second naming a path (GGUF duplicate-key
    confusion: two parsers that keep different copies)."""
    return gguf.base().add_string("general.architecture", "../../etc/passwd").bytes()


def wrong_tokenizer_type() -> bytes:
    """tokenizer.ggml.tokens as an array of u32, and scores as a string
    (type confusion in the vocabulary loader)."""
    return (gguf.base()
            .add_raw("tokenizer.ggml.tokens", gguf.ARRAY,
                     gguf.array(gguf.UINT32, 4, struct.pack("<4I", 1, 2, 3, 4)))
            .add_string("tokenizer.ggml.scores", "not an array").bytes())


def nested_arrays() -> bytes:
    """An array of arrays of arrays (unbounded recursion in a parser)."""
    inner = gguf.array(gguf.ARRAY, 1, gguf.array(gguf.ARRAY, 1, gguf.array(gguf.UINT32, 0)))
    return gguf.base().add_raw("x.nested", gguf.ARRAY, inner).bytes()


def ssti_template() -> bytes:
    """A chat template that reaches Python internals (CVE-2024-34359 class:
    server-side template injection through GGUF metadata)."""
    return gguf.base().add_string("tokenizer.chat_template", SSTI).bytes()


SSTI = "{{ ''.__class__.__mro__[1].__subclasses__() }}"

CASES: dict[str, Callable[[], bytes]] = {
    f.__name__: f for f in (past_eof, overflowing_elements, huge_string, huge_array,
                            huge_kv_count, duplicate_keys, wrong_tokenizer_type, nested_arrays,
                            ssti_template)
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile-gguf")
    written = {}
    for name, make in CASES.items():
        written[name] = folder / f"{name}.gguf"
        written[name].write_bytes(make())
    return written


def _need_llama() -> None:
    """Skip where llama.cpp's binding is missing, without importing it here
    (the parses that use it run in a child)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable")


#: Files the header reader must refuse: what it reads is bounded by them.
REFUSED_BY_READER = {"huge_string", "huge_array", "huge_kv_count", "nested_arrays"}

READER = """
from syntrop import modelfile
def parse(path):
    with open(path, "rb") as f:
        info = modelfile.read_fd(f.fileno())
    return f"{info.format} {info.architecture} {info.quantization}"
"""


def test_the_header_reader_refuses_or_reads_each_file_in_bounded_memory_and_time(
    files: dict[str, Path]
) -> None:
    outcomes = run_capped(READER, list(files.values()))
    for name, path in files.items():
        outcome = outcomes[str(path)]
        assert outcome.result in ("ok", "InvalidModel"), (name, outcome)
        assert timed(outcome.seconds), (name, outcome)
        if name in REFUSED_BY_READER:
            assert outcome.result == "InvalidModel", (name, outcome)


LOADER = """
from tests.models import Llama
def parse(path):
    try:
        Llama(model_path=path, n_ctx=16, n_threads=1, verbose=False).close()
    except ValueError as error:
        return "refused: " + str(error)[:200]
    return "loaded"
"""


def test_llama_cpp_refuses_each_file_without_dying(files: dict[str, Path]) -> None:
    """The loader runtimed's worker runs (llama.cpp's gguf_init and model
    loader) on the same files: a refusal (ValueError), never a signal."""
    _need_llama()
    outcomes = run_capped(LOADER, list(files.values()), timeout=60)
    for name, path in files.items():
        outcome = outcomes[str(path)]
        assert outcome.result == "ok" and outcome.detail.startswith("refused"), (name, outcome)
        assert timed(outcome.seconds), (name, outcome)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with modeld(tmp_path_factory.mktemp("store")) as running_store:
        yield running_store
        running_store.daemon.assert_healthy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_syn_pull_of_a_local_file_is_a_declared_answer_and_touches_only_the_store(
    store: Store, files: dict[str, Path], case: str
) -> None:
    path = files[case]
    before = path.read_bytes()
    result = store.syn("pull", str(path), "--name", case.replace("_", "-"), timeout=30)
    assert "Traceback" not in result.stderr, result.stderr
    if result.returncode != 0:
        assert "invalid" in result.stderr.lower() or "not a" in result.stderr.lower(), \
            result.stderr
    assert path.read_bytes() == before
    for found in store.visible():
        assert found.startswith(("blobs/sha256/", "by-name/")), found
    assert store.partials() == []
    assert store.call("List") is not None  # modeld still answers


class _Model:
    def token_get_text(self, token: int) -> str:
        return "</s>" if token == 2 else "<s>"


class _Llama:
    """What Engine.chat_prompt uses of llama_cpp.Llama."""

    def __init__(self, template: str) -> None:
        self.metadata = {"tokenizer.chat_template": template}
        self._model = _Model()

    def token_eos(self) -> int:
        return 2

    def token_bos(self) -> int:
        return 1

    def tokenize(self, text: bytes, *, add_bos: bool, special: bool) -> list[int]:
        return list(text)


#: Templates that reach for Python's internals or loop without end.
HOSTILE_TEMPLATES = [
    SSTI,
    "{{ self.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{% for i in range(10**12) %}x{% endfor %}",
    "{% for x in ",
]

RENDERER = """
from tests.security.test_gguf import _Llama
from syntrop.runtimed.worker.engine import Engine, LoadError
def parse(template):
    try:
        tokens, _ = Engine(_Llama(template)).chat_prompt([("user", "hi")])
    except LoadError as error:
        return "refused: " + error.reason
    return "rendered: " + bytes(tokens).decode(errors="replace")
"""


def test_the_chat_template_renderer_does_not_reach_python_internals() -> None:
    """Chat template server-side template injection (CVE-2024-34359 class):
    runtimed renders the GGUF's template in a sandbox; a template that
    reaches for __class__, __globals__ or an endless range, or does not
    parse, is refused as the model's fault (LoadError, answered
    InvalidModel), each within 2 s, in a capped child."""
    _need_llama()
    outcomes = run_capped(RENDERER, HOSTILE_TEMPLATES)
    for template in HOSTILE_TEMPLATES:
        outcome = outcomes[template]
        assert outcome.result == "ok", (template, outcome)
        assert outcome.detail.startswith("refused: the chat template failed"), (template, outcome)
        assert "uid=" not in outcome.detail and "<class" not in outcome.detail, outcome
        assert timed(outcome.seconds), (template, outcome)


def test_a_chat_template_cannot_allocate_without_bound() -> None:
    """Chat template resource exhaustion (CVE-2024-34359 class, the
    sandbox's other edge): `'a' * 10**10` asks for 10 GB. Rendered in a
    child capped at 2 GiB, it must be a template error, not MemoryError."""
    _need_llama()
    outcome = run_capped(RENDERER, ["{{ 'a' * 10**10 }}"])["{{ 'a' * 10**10 }}"]
    assert outcome.result == "ok" and outcome.detail.startswith("refused"), outcome
    assert timed(outcome.seconds), outcome
