"""The Varlink face of inferenced: io.syntrop.Inference1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.inference import Inference1


class InferenceService(Inference1):
    """Discovers compute planes and leases them by priority."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
