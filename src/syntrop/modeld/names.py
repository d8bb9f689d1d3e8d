"""Model names and digests, checked before anything is touched.

A model is called `name[:tag]`; the tag defaults to `latest`. The seed's
spelling `name:pinned` means "name:latest, pinned". Names and tags become
directory and file names in the by-name tree, so a segment must not be `.`
or `..`, contain `/`, `\\`, `:`, NUL, control or other unprintable
characters or white space, or be longer than 128 bytes (UTF-8).
"""

import re
from dataclasses import dataclass

DEFAULT_TAG = "latest"
PIN_TAG = "pinned"
MAX_SEGMENT = 128
#: How much of a rejected identifier an error repeats.
ECHO = 300

_DIGEST = re.compile(r"[0-9a-f]{64}")
_SLUG_DROP = re.compile(r"[^a-z0-9._-]+")


class InvalidName(ValueError):
    """An identifier that is not a valid name[:tag]."""

    def __init__(self, identifier: str) -> None:
        super().__init__(f"invalid model name {identifier[:ECHO]!r}")
        self.identifier = identifier[:ECHO]


class InvalidDigest(ValueError):
    """Not a SHA-256 in hex."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelName:
    name: str
    tag: str
    #: Spelled name:pinned.
    pinned: bool = False

    def __str__(self) -> str:
        return f"{self.name}:{self.tag}"


def valid_segment(text: str) -> bool:
    if not text or text in (".", "..") or len(text.encode("utf-8", "surrogatepass")) > MAX_SEGMENT:
        return False
    return all(
        ch.isprintable() and not ch.isspace() and ch not in "/\\:" for ch in text
    ) and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def parse(text: str) -> ModelName:
    """`name`, `name:tag` or `name:pinned`; InvalidName otherwise."""
    if text.count(":") > 1:
        raise InvalidName(text)
    name, colon, tag = text.partition(":")
    if not valid_segment(name) or (colon and not valid_segment(tag)):
        raise InvalidName(text)
    if tag == PIN_TAG:
        return ModelName(name=name, tag=DEFAULT_TAG, pinned=True)
    return ModelName(name=name, tag=tag or DEFAULT_TAG)


def digest(text: str) -> str:
    """A SHA-256 as 64 lowercase hex digits; `sha256:` prefix and upper case
    are accepted. InvalidDigest otherwise."""
    value = text.strip().lower().removeprefix("sha256:")
    if not _DIGEST.fullmatch(value):
        raise InvalidDigest(text[:ECHO])
    return value


def slug(text: str, fallback: str = "model") -> str:
    """A valid name segment derived from free text (a file or repository
    name): lower case, runs of other characters become '-'."""
    value = _SLUG_DROP.sub("-", text.lower()).strip("-.")
    value = value[:MAX_SEGMENT].rstrip("-.")
    return value if valid_segment(value) else fallback
