"""Apply a plan to a model with PyTorch's own parallel primitives (imports torch).

Entry point: :func:`parallelize` (in :mod:`.parallelize`).
"""
from .parallelize import ParallelModel, parallelize

__all__ = ["parallelize", "ParallelModel"]
