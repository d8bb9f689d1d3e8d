"""toold: Runs typed, sandboxed, reversible remediation actions."""
