"""toold's domain errors. service.py maps each to the declared Varlink error
of the same meaning; nothing here imports the Varlink library."""


class ToolError(Exception):
    """Base: a request refused before anything was changed."""

    #: The Varlink error this becomes, by name (for the audit record).
    error = "io.syntrop.Tool1.ToolError"

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.fields = fields


class UnknownTool(ToolError):
    error = "io.syntrop.Tool1.ToolNotFound"


class BadArgument(ToolError):
    error = "io.syntrop.Tool1.InvalidArgument"


class NotAllowed(ToolError):
    error = "io.syntrop.Tool1.UnitNotAllowed"


class NotFound(ToolError):
    error = "io.syntrop.Tool1.UnitNotFound"


class Busy(ToolError):
    error = "io.syntrop.Tool1.UnitBusy"


class Limited(ToolError):
    error = "io.syntrop.Tool1.RateLimited"


class NoSandbox(ToolError):
    error = "io.syntrop.Tool1.SandboxUnavailable"


class Unsafe(ToolError):
    error = "io.syntrop.Tool1.UnsafePath"


class NoPrevious(ToolError):
    error = "io.syntrop.Tool1.NoPreviousVersion"


class NoSystemd(ToolError):
    error = "io.syntrop.Tool1.SystemdUnavailable"


class Denied(ToolError):
    """Not root, not the sentry uid, and polkit did not authorize it
    (fields: action)."""

    error = "io.syntrop.Tool1.NotAuthorized"


class PlanError(ToolError):
    """A plan refused as a whole (fields: reason, step, words)."""

    error = "io.syntrop.Tool1.PlanRefused"
