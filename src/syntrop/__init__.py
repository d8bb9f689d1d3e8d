"""syntrop: a self-healing, accelerator-aware inference layer for Linux hosts.

Seven socket-activated daemons, each serving one Varlink interface under
/run/syntrop. See docs/ARCHITECTURE.md.
"""

__version__ = "0.1.0"
