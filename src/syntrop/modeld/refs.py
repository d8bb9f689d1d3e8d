"""Pull references, parsed without touching the network.

    hf://org/repo[@revision]/path/file.gguf
    ollama://[registry/]namespace/model[:tag]     (namespace defaults to library)
    ollama://model[:tag]
    https://host/path/file.gguf    (also http://; needs an expected SHA-256)
    /a/local/path.gguf, ./relative.gguf

Each kind also says what the model is called when the caller names nothing
(`default_name`).
"""

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from syntrop.modeld import names

MAX_REFERENCE = 4096

_HF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9._%-]{1,255}")
_OLLAMA_PART = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_OLLAMA_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_REGISTRY = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


class InvalidReference(ValueError):
    def __init__(self, reference: str, reason: str) -> None:
        super().__init__(f"{reference[:names.ECHO]}: {reason}")
        self.reference = reference[: names.ECHO]
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class HfRef:
    repo_id: str
    revision: str
    filename: str

    def __str__(self) -> str:
        revision = "" if self.revision == "main" else f"@{self.revision}"
        org, repo = self.repo_id.split("/")
        return f"hf://{org}/{repo}{revision}/{self.filename}"


@dataclass(frozen=True, slots=True, kw_only=True)
class OllamaRef:
    registry: str | None
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        registry = f"{self.registry}/" if self.registry else ""
        return f"ollama://{registry}{self.namespace}/{self.model}:{self.tag}"


@dataclass(frozen=True, slots=True, kw_only=True)
class UrlRef:
    url: str

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True, slots=True, kw_only=True)
class PathRef:
    path: str

    def __str__(self) -> str:
        return self.path


Reference = HfRef | OllamaRef | UrlRef | PathRef


def parse(text: str) -> Reference:
    if not text:
        raise InvalidReference(text, "empty")
    if len(text) > MAX_REFERENCE:
        raise InvalidReference(text, f"longer than {MAX_REFERENCE} characters")
    if any(not ch.isprintable() for ch in text):
        raise InvalidReference(text, "contains control characters")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return PathRef(path=text)
    scheme = scheme.lower()
    if scheme == "hf":
        return _hf(text, rest)
    if scheme == "ollama":
        return _ollama(text, rest)
    if scheme in ("https", "http"):
        parts = urlsplit(text)
        if not parts.hostname:
            raise InvalidReference(text, "no host")
        if not PurePosixPath(parts.path).name:
            raise InvalidReference(text, "the URL names no file")
        return UrlRef(url=text)
    raise InvalidReference(text, f"unknown scheme {scheme}:// (hf, ollama, https, http or a path)")


def _hf(text: str, rest: str) -> HfRef:
    parts = rest.split("/")
    if len(parts) < 3:
        raise InvalidReference(text, "expected hf://org/repo[@revision]/file")
    org, repo, files = parts[0], parts[1], parts[2:]
    repo, at, revision = repo.partition("@")
    if at and not _REVISION.fullmatch(revision):
        raise InvalidReference(text, "invalid revision")
    for part, what in ((org, "organisation"), (repo, "repository")):
        if not _HF_PART.fullmatch(part) or ".." in part:
            raise InvalidReference(text, f"invalid {what} name {part!r}")
    if any(part in ("", ".", "..") for part in files):
        raise InvalidReference(text, "invalid file path")
    return HfRef(repo_id=f"{org}/{repo}", revision=revision or "main", filename="/".join(files))


def _ollama(text: str, rest: str) -> OllamaRef:
    parts = rest.split("/")
    if not 1 <= len(parts) <= 3:
        raise InvalidReference(text, "expected ollama://[registry/]namespace/model[:tag]")
    registry = parts[0] if len(parts) == 3 else None
    namespace = parts[-2] if len(parts) >= 2 else "library"
    model, colon, tag = parts[-1].partition(":")
    tag = tag if colon else "latest"
    if registry is not None and not _REGISTRY.fullmatch(registry):
        raise InvalidReference(text, f"invalid registry {registry!r}")
    for part, what in ((namespace, "namespace"), (model, "model")):
        if not _OLLAMA_PART.fullmatch(part) or ".." in part:
            raise InvalidReference(text, f"invalid {what} {part!r}")
    if not _OLLAMA_TAG.fullmatch(tag):
        raise InvalidReference(text, f"invalid tag {tag!r}")
    return OllamaRef(registry=registry, namespace=namespace, model=model, tag=tag)


def default_name(reference: Reference) -> str:
    """name:tag for a model pulled from `reference` without --name."""
    match reference:
        case HfRef(repo_id=repo_id, filename=filename):
            base = names.slug(repo_id.split("/")[1].removesuffix("-GGUF").removesuffix("-gguf"))
            stem = names.slug(_stem(filename))
            tag = stem.removeprefix(base).lstrip("-._") or "latest"
            return f"{base}:{names.slug(tag, 'latest')}"
        case OllamaRef(namespace=namespace, model=model, tag=tag):
            base = model if namespace == "library" else f"{namespace}-{model}"
            return f"{names.slug(base)}:{names.slug(tag, 'latest')}"
        case UrlRef(url=url):
            return f"{names.slug(_stem(urlsplit(url).path))}:latest"
        case PathRef(path=path):
            return f"{names.slug(_stem(path))}:latest"


def _stem(path: str) -> str:
    name = PurePosixPath(path).name
    for suffix in (".gguf", ".safetensors", ".bin"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name
