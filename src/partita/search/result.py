"""What a search returns: every candidate it evaluated (:class:`Attempt`) and the ranked
plans with their counts (:class:`SearchResult`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cost.memory import GIB, fits
from ..estimate import Estimate
from ..plan import Plan
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec


@dataclass
class Attempt:
    """One evaluated candidate: its plan, memory, and (if it fits) its estimate."""

    plan: Plan
    peak_gib: float
    peak_rank: int
    memory_limit_gib: float  # what it had to fit in (the search's limit)
    estimate: Estimate | None = None
    bounded: bool = False  # fits, but provably slower than what the search already had

    @property
    def fits(self) -> bool:
        return fits(self.peak_gib * GIB, self.memory_limit_gib)


@dataclass
class SearchResult:
    model: ModelSpec
    cluster: Cluster
    plans: list[Estimate]
    attempts: list[Attempt]
    candidates_evaluated: int
    search_time_s: float
    memory_limit_gib: float
    candidates_pruned: int = 0  # layouts skipped by memory dominance, never evaluated
    candidates_bounded: int = 0  # layouts or plans whose time bound could not beat the best found
    invalid: list[str] = field(default_factory=list)
    #: per knob, the values nearest the best plan's that the search resolved for "why not"
    alternatives: dict[str, list] = field(default_factory=dict)
    #: the named memory limit (usable memory, headroom, cap: partita.uncertainty.MemoryLimit)
    limit: Any = None
    #: the largest predicted peak kept: P(fit) >= min_p_fit above it is impossible (0: the limit)
    admission_limit_gib: float = 0.0
    #: the largest predicted peak with P(fit) = 1: partial recompute's N is solved against it
    confident_limit_gib: float = 0.0
    min_p_fit: float = 0.05

    @property
    def best(self) -> Estimate | None:
        return self.plans[0] if self.plans else None
