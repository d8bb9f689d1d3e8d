"""The seven contracts, as Python classes, one module each. interfaces/*.varlink
is rendered from them (make idl) and a test keeps the two equal.

Clients import the contract they need (syntrop.interfaces.inference); the
daemon serving it derives its service class from it. Daemons never import
each other, only these. This package imports nothing itself, so a daemon
builds only its own contract at start-up; syntrop.interfaces.catalog lists
all seven.
"""
