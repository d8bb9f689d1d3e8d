"""syntrop.system.digest: CPython's own SHA-256 gives hashlib's digests."""

import hashlib

from syntrop.system.digest import sha256


def test_same_digests_as_hashlib_whole_and_in_parts() -> None:
    data = bytes(range(256)) * 300
    assert sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    state = sha256()
    state.update(data[:1000])
    fork = state.copy()
    state.update(data[1000:])
    assert state.digest() == hashlib.sha256(data).digest()
    assert fork.hexdigest() == hashlib.sha256(data[:1000]).hexdigest()
