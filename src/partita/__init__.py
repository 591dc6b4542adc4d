"""Partita: plan, run, profile and calibrate parallel training of large language models.

Planning (``partita.estimate``, ``partita.search``) is pure Python and never imports
torch; the runtime (``partita.runtime``) does.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import PartitaError
from .plan import Plan

__all__ = ["Plan", "PartitaError", "__version__", "trace"]


def __getattr__(name: str):
    """``partita.trace`` imports torch only when it is used (planning never does)."""
    if name == "trace":
        from .tracing import trace
        return trace
    raise AttributeError(f"module 'partita' has no attribute {name!r}")
