"""Tracing any PyTorch model into a spec the planner reads (:func:`trace`).

``trace`` is imported on first use, so the torch-free parts (:mod:`.cache`) load without
torch (``partita plan`` from a cached trace never imports it)."""
from __future__ import annotations

from typing import Any

__all__ = ["trace"]


def __getattr__(name: str) -> Any:
    if name == "trace":
        from .tracer import trace
        globals()["trace"] = trace
        return trace
    raise AttributeError(f"module 'partita.tracing' has no attribute {name!r}")
