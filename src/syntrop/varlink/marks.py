"""Attribute names contract.py sets on a contract's methods and idl.py reads
(a module of its own, so that neither imports the other at start-up: the
IDL is rendered only when asked for)."""

#: The options of a method's @method (return_parameter, more, ...).
OPTIONS = "_syntrop_options"
