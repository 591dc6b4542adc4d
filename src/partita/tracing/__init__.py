"""Tracing any PyTorch model into a spec the planner reads (:func:`trace`)."""
from __future__ import annotations

from .trace import trace

__all__ = ["trace"]
