"""The Varlink face of toold: io.syntrop.Tool1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.tool import Tool1


class ToolService(Tool1):
    """Runs typed, sandboxed, reversible remediation actions."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
