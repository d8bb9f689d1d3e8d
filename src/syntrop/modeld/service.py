"""The Varlink face of modeld: io.syntrop.Model1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.model import Model1


class ModelService(Model1):
    """The content-addressed model store."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
