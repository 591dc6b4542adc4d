"""Partial recompute: full recompute of only the first N layers of each model chunk
(``plan.recompute_layers``), the search's solver for the least N that fits and the lower
bound of such a plan's step time.

A rank's activation memory is linear in N (:func:`partita.cost.activations._partial_layers`:
each recomputed layer keeps its input only [Korthikanti et al. 2022, sec. 4.1]), so the
least N that fits a memory limit is solved from two peaks rather than enumerated
(:func:`least_recompute_layers`); its step time is bounded from the per-layer terms with
and without recompute (:func:`partial_lower_bound`). :mod:`.engine` files each layout's
partial plans under that bound and estimates those that can matter.
"""
from __future__ import annotations

import math

from ..cost.memory import GIB, distinct_shapes, fits, memory_parts, peak_memory
from ..cost.pipeline import pipeline_time_of
from ..cost.step import async_send, stage_terms, step_time_lower_bound
from ..plan import Plan
from ..spec.hardware import Cluster, Device
from ..spec.model import ModelSpec
from .layouts import Layout


def least_recompute_layers(model: ModelSpec, device: Device, plan: Plan, limit_gib: float) -> int:
    """The smallest ``recompute_layers`` N with which ``plan``'s layout fits ``limit_gib``
    under full recompute; 0 when full recompute of every layer is needed or nothing fits.

    Solved, not enumerated: a rank's peak falls linearly with the layers it recomputes
    (:func:`_partial_layers`: each saves ``A_none - A_full``), from its peak without
    recompute ``P_none`` to ``P_full`` when all its ``c`` layers per chunk are; fitting
    needs ``N >= c (P_none - limit) / (P_none - P_full)`` on every rank (the allocator
    slack scales the allocation, so the peak stays linear). One check of the answer
    (and at most two steps up) covers what the line does not: uneven chunks (a chunk
    shorter than N recomputes all its layers) and MoE layers placed unevenly."""
    largest = max(plan.stage_layers(model.layers))
    base = plan.with_(recompute="full", recompute_layers=0)
    steps = [("none", plan.zero), ("full", plan.zero)]
    limit = limit_gib * GIB
    n = 1
    for r, shape, _ in distinct_shapes(model, base):
        parts = memory_parts(model, device, base, r, shape, steps)
        hi, lo = parts[steps[0]].peak(device), parts[steps[1]].peak(device)
        if lo > limit:
            return 0
        if hi > limit:
            n = max(n, math.ceil((hi - limit) / (hi - lo) * shape.n_layers / plan.vpp - 1e-9))
    for _ in range(3):
        if n >= largest:
            return 0
        if fits(peak_memory(model, device, base.with_(recompute_layers=n))[0], limit_gib):
            return n
        n += 1
    return 0


def partial_lower_bound(model: ModelSpec, cluster: Cluster, plan: Plan, none_bound: float | None = None) -> float:
    """Lower bound of the step time of a partial full-recompute plan (``recompute_layers``
    N > 0, zero <= 2): :func:`step_time_lower_bound`'s sum over rank shapes with each rank's
    recomputed layers (``shape.rc_dense`` / ``rc_moe``, the first N of each chunk) at the
    full-recompute per-layer time and the others at the no-recompute one - the same split
    :func:`partita.cost.step._partial_terms` makes of the estimate. The pipeline time
    (``m * slowest + (total - slowest) / v``) is monotone in every stage's time, so a
    bound at N holds for every larger N. What follows the pipeline does not depend on
    recompute: it is the no-recompute bound (``none_bound`` when the caller has it)
    less its own pipeline part."""
    none = plan.with_(recompute="none", recompute_layers=0)
    _, (dn, mn, emb, out, const) = stage_terms(model, cluster, none)
    _, (df, mf, _, _, _) = stage_terms(model, cluster, plan.with_(recompute_layers=0))
    totals = {}
    hidden = 2 * plan.grad_accum * async_send(model, cluster, plan)
    for key, p in (("none", none), ("partial", plan)):
        total = slowest = 0.0
        for _, shape, count in distinct_shapes(model, p):
            rc_d, rc_m = (shape.rc_dense, shape.rc_moe) if key == "partial" else (0, 0)
            n_d = shape.n_layers - shape.n_moe
            t = (rc_d * df + (n_d - rc_d) * dn + rc_m * mf + (shape.n_moe - rc_m) * mn
                 + shape.first * emb + shape.last * out + const)
            total += count * t
            slowest = max(slowest, t)
        # less the sends an asynchronous pipeline hides, as step_time_lower_bound takes them off
        totals[key] = pipeline_time_of(total, slowest, plan.grad_accum, plan.vpp, plan.schedule) - hidden
    if none_bound is None:
        none_bound = step_time_lower_bound(model, cluster, none)
    after = none_bound - totals["none"]
    return totals["partial"] + max(0.0, after)


class PartialPlans:
    """Each layout's partial plan per ZeRO stage: the full-recompute plan with the fewest
    recomputed layers per chunk that fit ``usable_gib`` (:func:`least_recompute_layers`),
    with its peak bytes and rank - or None when none fits. Solved once per (layout, zero):
    a layout's plan is frozen and lives as long as the search, so the key is its id and
    the one setting field the solve varies."""

    def __init__(self, model: ModelSpec, device: Device, usable_gib: float):
        self.model, self.device, self.usable = model, device, usable_gib
        self._plans: dict[tuple[int, int], tuple[Plan, float, int] | None] = {}

    def solved(self, layout: Layout, zero: int) -> bool:
        """Whether :meth:`get` has solved the layout at ``zero`` already."""
        return (id(layout), zero) in self._plans

    def get(self, layout: Layout, zero: int) -> tuple[Plan, float, int] | None:
        """(plan, peak bytes, peak rank) of the layout's partial plan at ``zero``; None when
        no partial plan fits (memoised)."""
        key = (id(layout), zero)
        if key not in self._plans:
            full = layout.plan.with_(recompute="full", zero=zero)
            n = least_recompute_layers(self.model, self.device, full, self.usable)
            plan = full.with_(recompute_layers=n)
            self._plans[key] = (plan, *peak_memory(self.model, self.device, plan)) if n else None
        return self._plans[key]
