"""The seven interface names, and nothing else: a daemon that only needs
another's socket path (paths.socket(MODEL)) imports this, not that
interface's contract (building a contract's classes costs milliseconds of
every cold start)."""

CONTEXT = "io.syntrop.Context1"
INFERENCE = "io.syntrop.Inference1"
MODEL = "io.syntrop.Model1"
ROUTER = "io.syntrop.Router1"
RUNTIME = "io.syntrop.Runtime1"
SENTRY = "io.syntrop.Sentry1"
TOOL = "io.syntrop.Tool1"
