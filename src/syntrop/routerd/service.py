"""The Varlink face of routerd: io.syntrop.Router1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.router import Router1


class RouterService(Router1):
    """Routes OpenAI-style requests between providers."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
