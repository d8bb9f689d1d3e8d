"""Digests of a chat's prefixes: how a router knows which runtimed already
holds the KV cache of a conversation's start.

A chat is a list of turns (role, text), as runtimed takes them. Digest i
covers turns 0..i, chained: each is SHA-256 over the one before and the
turn, so equal digests mean equal turns up to there. runtimed reports the
digests of the chats whose KV its idle contexts hold (Runtime1.GetLoad);
routerd computes the same chain from a request, as it would send it, and
routes to the provider holding the deepest digest of it. A digest is a
routing hint only: runtimed reuses KV by comparing tokens, never by digest.

No I/O, and not hashlib (syntrop.system.digest): `import hashlib` loads
OpenSSL's libcrypto, about 3 MiB of routerd's 24 MiB budget.
"""

from collections.abc import Collection, Sequence

from syntrop.system.digest import sha256

#: Hex characters kept of each digest (64 bits: collisions do not matter
#: for a hint, and a fleet record stays small).
DIGEST_HEX = 16
#: Digests a context reports: the first few (a shared system prompt) and
#: the last ones (a conversation going on).
REPORT_FIRST, REPORT_LAST = 4, 12


def chain(turns: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """Each prefix's digest and its length in characters of text."""
    state = sha256(b"syntrop-chat-prefix")
    out, chars = [], 0
    for role, text in turns:
        encoded = text.encode()
        state.update(len(role).to_bytes(4, "big") + role.encode()
                     + len(encoded).to_bytes(8, "big") + encoded)
        chars += len(text)
        out.append((state.copy().hexdigest()[:DIGEST_HEX], chars))
    return out


def reported(turns: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The digests a context holding `turns` reports (at most
    REPORT_FIRST + REPORT_LAST of them)."""
    digests = [digest for digest, _ in chain(turns)]
    if len(digests) > REPORT_FIRST + REPORT_LAST:
        digests = digests[:REPORT_FIRST] + digests[-REPORT_LAST:]
    return tuple(digests)


def matched(prefixes: Sequence[tuple[str, int]], resident: Collection[str]) -> int:
    """Characters of the longest prefix of `prefixes` (a `chain`) whose
    digest is in `resident`; 0 for none."""
    for digest, chars in reversed(prefixes):
        if digest in resident:
            return chars
    return 0
