"""The Varlink face of contextd: io.syntrop.Context1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.context import Context1


class ContextService(Context1):
    """Knows what changed on the host."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
