"""Thin adapters to the kernel and to systemd, one concern per module.

Nothing here imports a daemon; daemons import these.
"""
