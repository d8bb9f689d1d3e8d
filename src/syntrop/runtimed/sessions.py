"""Persistent sessions after the session contract: the resident token state,
the reuse rule, and the owner fence.

Pure bookkeeping: the engine does the prefill; this module decides how much
of what is resident can be kept. Reuse is valid only when the manifest (the
cache key: model, tokenizer, template, runtime config, BOS policy, profile)
matches exactly; then the longest common token prefix is kept and only the
divergent tail is prefilled. Byte equality alone is never enough.

Fence: the newest owner instance id seen by OpenSession is the current epoch.
Sessions opened under an older owner answer `StaleSession` from then on.
"""

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from syntrop.system.digest import sha256

E = TypeVar("E")

MAX_SESSIONS = 64


class SessionError(Exception):
    """Base of session errors."""


class UnknownSession(SessionError):
    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id


class StaleSession(SessionError):
    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id
        self.owner = owner


def sha256_hex(data: bytes) -> str:
    return str(sha256(data).hexdigest())


def token_hash(tokens: Sequence[int]) -> str:
    """SHA-256 of the tokens as little-endian 32-bit integers."""
    return sha256_hex(b"".join(t.to_bytes(4, "little", signed=True) for t in tokens))


def manifest_digest(manifest: Mapping[str, object]) -> str:
    """SHA-256 of the manifest's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(dict(manifest), sort_keys=True, separators=(",", ":"))
    return "sha256:" + sha256_hex(text.encode())


#: Prompt formats a session may declare (SessionConfig.prompt_format), by
#: the marker a chat template of that format writes; raw declares none.
PROMPT_FORMATS: dict[str, str | None] = {
    "chatml": "<|im_start|>", "gemma": "<start_of_turn>", "llama3": "<|start_header_id|>",
    "mistral": "[INST]", "raw": None,
}


def template_format(template: str | None) -> str | None:
    """The prompt format a chat template writes (PROMPT_FORMATS); None when
    it has none of their markers, or there is no template."""
    for name, marker in PROMPT_FORMATS.items():
        if marker is not None and template is not None and marker in template:
            return name
    return None


def common_prefix(resident: Sequence[int], wanted: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for a, b in zip(resident, wanted, strict=False):
        if a != b:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What EnsurePrefix will do: keep `reused`, drop `dropped`, prefill `prefill`."""

    reused: int
    dropped: int
    prefill: list[int]


def plan_prefix(
    resident: Sequence[int], resident_digest: str | None, wanted: Sequence[int], digest: str
) -> Plan:
    """Plan the move from the resident tokens to `wanted`. A different
    manifest keeps nothing."""
    keep = common_prefix(resident, wanted) if resident_digest == digest else 0
    return Plan(reused=keep, dropped=len(resident) - keep, prefill=list(wanted[keep:]))


@dataclass(slots=True, kw_only=True)
class Session(Generic[E]):
    """One session: its owner epoch, its engine, and what is resident."""

    session_id: str
    owner: str
    model: str
    engine: E
    add_bos: bool = True
    prefix_tokens: int = 0
    manifest: dict[str, str] | None = None
    manifest_digest: str | None = None
    stable_byte_hash: str = ""
    stable_token_hash: str = ""
    closed: bool = False
    #: The uid that opened it: owner epochs are per uid, so one user's
    #: takeover never ends another user's sessions.
    uid: int = 0


def tag(session_id: str) -> str:
    """A session's name in logs: enough to tell sessions apart, never the
    whole id (which, with the opener's uid, is what acts on it)."""
    return session_id[:8] + "…"


class SessionTable(Generic[E]):
    """Open sessions by id, and each uid's current owner epoch."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self.owners: dict[int, str] = {}
        self._sessions: dict[str, Session[E]] = {}
        # Ids of sessions ended by a takeover, so they answer StaleSession
        # rather than UnknownSession (bounded: oldest forgotten first).
        self._stale: dict[str, tuple[str, int]] = {}  # id → (the owner that took over, uid)

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session[E]]:
        return iter(list(self._sessions.values()))

    def fence(self, owner: str, uid: int = 0) -> list[Session[E]]:
        """Make `owner` the current epoch of `uid`. A takeover (a different
        owner) ends every session of that uid's older owners; they are
        returned for the caller to free."""
        self.owners[uid] = owner
        ended = [s for s in self._sessions.values() if s.uid == uid and s.owner != owner]
        for session in ended:
            del self._sessions[session.session_id]
            session.closed = True
            self._stale[session.session_id] = (owner, uid)
        while len(self._stale) > 4 * self.limit:
            del self._stale[next(iter(self._stale))]
        return ended

    def add(self, *, owner: str, model: str, engine: E, add_bos: bool = True,
            session_id: str | None = None, uid: int = 0) -> Session[E]:
        session = Session(session_id=session_id or os.urandom(16).hex(), owner=owner, model=model,
                          engine=engine, add_bos=add_bos, uid=uid)
        self._sessions[session.session_id] = session
        return session

    def _find(self, session_id: str, may: Callable[[int], bool]) -> Session[E]:
        """The live session, if `may` admits its uid; a session another uid
        may not touch is UnknownSession, so its existence is not revealed."""
        session = self._sessions.get(session_id)
        if session is not None and may(session.uid):
            return session
        stale = self._stale.get(session_id)
        if session is None and stale is not None and may(stale[1]):
            raise StaleSession(session_id, stale[0])
        raise UnknownSession(session_id)

    def get(self, session_id: str, may: Callable[[int], bool] = lambda uid: True) -> Session[E]:
        """The live session, or UnknownSession / StaleSession. `may`: whether
        the caller may see a session of this uid."""
        session = self._find(session_id, may)
        current = self.owners.get(session.uid, "")
        if session.owner != current:
            raise StaleSession(session_id, current)
        return session

    def remove(self, session_id: str, may: Callable[[int], bool] = lambda uid: True,
               ) -> Session[E]:
        session = self._find(session_id, may)
        del self._sessions[session_id]
        session.closed = True
        return session
