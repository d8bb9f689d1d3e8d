"""All seven contracts, in the order the suite lists its daemons."""

from syntrop.interfaces.context import Context1
from syntrop.interfaces.inference import Inference1
from syntrop.interfaces.model import Model1
from syntrop.interfaces.router import Router1
from syntrop.interfaces.runtime import Runtime1
from syntrop.interfaces.sentry import Sentry1
from syntrop.interfaces.tool import Tool1

ALL = (Inference1, Model1, Context1, Tool1, Runtime1, Sentry1, Router1)
