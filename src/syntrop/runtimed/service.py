"""The Varlink face of runtimed: io.syntrop.Runtime1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.runtime import Runtime1


class RuntimeService(Runtime1):
    """Runs GGUF models with persistent sessions."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
