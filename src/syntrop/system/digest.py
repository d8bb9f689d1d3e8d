"""SHA-256 for small inputs without loading libcrypto.

`import hashlib` loads OpenSSL's libcrypto: about 5 ms of a cold start's
CPU and 3 MiB of mappings, for a daemon that hashes a session key or a
file's first kilobytes. CPython's own SHA-256 gives the same digests;
OpenSSL's is several times faster on large inputs, so bulk hashing (model
blobs, pulls) still imports hashlib, where it hashes.
"""

import functools
import importlib
from collections.abc import Callable
from typing import Any


@functools.cache
def _constructor() -> Callable[[bytes], Any]:
    """CPython's own sha256, found once: asking for "_sha2" on Python 3.11
    is a failed import that searches sys.path, about 120 µs each time."""
    try:
        module = importlib.import_module("_sha2")  # Python 3.12 and later
    except ImportError:
        module = importlib.import_module("_sha256")
    constructor: Callable[[bytes], Any] = module.sha256
    return constructor


def sha256(data: bytes = b"") -> Any:
    """A SHA-256 object (update, copy, digest, hexdigest), CPython's builtin one."""
    return _constructor()(data)
