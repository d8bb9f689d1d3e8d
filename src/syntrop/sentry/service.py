"""The Varlink face of systemd-sentry: io.syntrop.Sentry1.

Methods not implemented here answer org.varlink.service.MethodNotImplemented
(inherited from the contract) until their issue lands.
"""

from syntrop.config import Paths
from syntrop.interfaces.sentry import Sentry1


class SentryService(Sentry1):
    """Watches systemd and drives the triage loop."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
