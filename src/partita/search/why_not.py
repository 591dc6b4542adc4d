"""The "why not" pass: after the ranking, for each knob the values nearest the best plan's
and the best plan the search can find at each - what :func:`.explain.why_not` turns into
its lines ("why not pp=4: rank 0 needs 71 GiB > 64 GiB").

It runs on the ranking search through :class:`RankedSearch` only (the search's public
methods; it writes none of the search's state), reusing the layouts' memory and bounds
the first pass computed, with the same branch-and-bound rule per knob value.
"""
from __future__ import annotations

import math
from typing import Protocol

from ..cost.memory import GIB, peak_memory
from ..cost.step import estimate_step_time
from ..estimate import Estimate
from ..plan import RECOMPUTE, Plan
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from .layouts import EXPLAINED_KNOBS, Layout, LayoutQueue
from .result import Attempt


def nearest_values(knob: str, mine, values) -> list:
    """The two values of ``knob`` closest to ``mine`` (log2 distance for degrees, list
    distance for modes): the alternatives the "why not" lines explain."""
    others = sorted({v for v in values if v != mine},
                    key=lambda v: (abs(knob_order(knob, v) - knob_order(knob, mine)), knob_order(knob, v)))
    return others[:2]


def knob_order(knob: str, value) -> float:
    """Position of a knob value on its axis: log2 for degrees, list index for modes."""
    if knob == "recompute":
        return RECOMPUTE.index(value)
    return math.log2(value) if isinstance(value, int) and value > 0 else float(value)


class RankedSearch(Protocol):
    """What the "why not" pass needs from the ranking search (:class:`.engine._Search`)
    once the first pass is over - its whole interface to it: the pass reads the
    attempts and the best time found per knob value, asks the search to close its
    ranking, and evaluates layouts for the values it wants; it writes no state of the
    search itself."""

    attempts: list[Attempt]  # read: every candidate evaluated so far
    best_by_knob: dict[tuple[str, object], float]  # read: the best step time per (knob, value)

    def close_ranking(self, layouts: LayoutQueue) -> None:
        """End the ranking pass: later estimates only explain (see :meth:`.engine._Search.close_ranking`)."""

    def bound_for(self, layout: Layout, knob_value: tuple[str, object]) -> float:
        """The layout's lower bound for plans with ``knob_value``."""

    def evaluate(self, layout: Layout, wanted: list[tuple[str, object]] | None = None) -> bool:
        """Evaluate the layout for the ``wanted`` knob values; True when it should wait in the queue."""


def alternatives(search: RankedSearch, layouts: LayoutQueue, best: Plan,
                 per_node: int) -> tuple[dict[str, list], LayoutQueue]:
    """The second pass: for each knob, the values nearest the best plan's, and the best
    plan the search can find at each (the "why not" alternatives). Layouts in bound order
    again, each evaluated for the values whose best it may still beat, until no layout
    left can beat any. A layout whose tp group crosses nodes serves only its tp value
    (the ranking leaves such plans out, so they explain tp alone), and is built only when
    such a tp value is wanted. Returns the alternatives and the queue it walked."""
    values: dict[str, set] = {knob: set() for knob in EXPLAINED_KNOBS}
    for knob, value in {kv for lay in layouts.layouts for kv in lay.knob_values} | layouts.deferred_values:
        values[knob].add(value)
    found = {knob: nearest_values(knob, getattr(best, knob), values[knob]) for knob in EXPLAINED_KNOBS}
    # etp is explained from the plans the search estimated anyway, not hunted for: a walk
    # for its best plan at each value costs a quarter of the search time on the MoE
    # benchmarks (bench/search_speed.py), for a knob that only trades memory for traffic
    found["etp"] = nearest_values("etp", best.etp, {a.plan.etp for a in search.attempts})
    if not found["etp"]:
        del found["etp"]  # no etp > 1 tried (dense models): results keep their keys
    targets = {(k, v) for k, vs in found.items() for v in vs if k != "etp"}
    search.close_ranking(layouts)
    rest = layouts.with_cross_node(any(v > per_node for v in found["tp"]))
    best_by_knob = search.best_by_knob
    for layout in rest:
        if not targets or layout.floor >= max(best_by_knob.get(kv, float("inf")) for kv in targets):
            break  # sorted by bound: no later layout can improve any alternative (none wanted: every knob fixed)
        wanted = [kv for kv in layout.knob_values if kv in targets and (layout.rankable or kv[0] == "tp")
                  and kv not in layout.resolved and search.bound_for(layout, kv) < best_by_knob.get(kv, float("inf"))]
        if wanted and search.evaluate(layout, wanted):
            rest.push(layout)
    return found, rest


def partial_neighbours(model: ModelSpec, cluster: Cluster, best: Plan, usable: float,
                       attempts: list[Attempt]) -> list[Attempt]:
    """The attempts a "why not" line on the best plan's ``recompute_layers`` N compares
    (:func:`.explain.why_not`): the same layout recomputing every layer (N = 0, its time)
    and one layer fewer per chunk (N - 1, its memory - the least N that fits is N), each
    unless ``attempts`` (the search's) already has it. Returned, for the caller to add."""
    have = {a.plan for a in attempts}
    n = best.recompute_layers
    out = []
    for k in (0, n - 1) if n > 1 else (0,):
        plan = best.with_(recompute_layers=k)
        if plan in have:
            continue
        pb, pr = peak_memory(model, cluster.device, plan)
        attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr, memory_limit_gib=usable)
        if attempt.fits:
            attempt.estimate = Estimate(model=model, cluster=cluster, plan=plan,
                                        time=estimate_step_time(model, cluster, plan), memory_limit=usable)
        out.append(attempt)
    return out
