"""The seven contracts, as Python classes. interfaces/*.varlink is rendered
from these (make idl) and a test keeps the two equal.

Clients import the contract; the daemon serving it derives its service class
from it. Daemons never import each other, only these.
"""

from syntrop.interfaces.context import Context1
from syntrop.interfaces.inference import Inference1
from syntrop.interfaces.model import Model1
from syntrop.interfaces.router import Router1
from syntrop.interfaces.runtime import Runtime1
from syntrop.interfaces.sentry import Sentry1
from syntrop.interfaces.tool import Tool1

ALL = (Inference1, Model1, Context1, Tool1, Runtime1, Sentry1, Router1)

__all__ = ["ALL", "Context1", "Inference1", "Model1", "Router1", "Runtime1", "Sentry1", "Tool1"]
