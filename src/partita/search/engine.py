"""Enumerate, prune by memory, rank by predicted step time - a branch and bound.

Every structural layout (tp, cp, pp, dp, ep, mbs, vpp and its layer split) gets a lower
bound of the step time of any plan it can produce (:func:`step_time_lower_bound`:
per-micro-batch compute and communication through the pipeline, no recompute). Layouts
are evaluated in bound order; once the next bound is no better than the K-th best plan
found, every later layout is provably slower and the first pass stops. A second pass
finds the best plan at the two values nearest the winner's of every knob (the "why not"
alternatives), with the same rule per value.

Evaluating a layout walks its memory-saving knobs in order of cost - recompute none ->
selective -> full, zero 1 -> 2, and zero 3 separately when allowed - and keeps the first
setting that fits (each later setting only adds time in the cost model, so nothing
faster is skipped). Memory dominance rules out layouts that cannot fit without
evaluating them. Every memory evaluation of a setting is counted in
``candidates_evaluated``; layouts and settings ruled out by a bound in
``candidates_pruned`` (memory) and ``candidates_bounded`` (time).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

from ..cost.memory import GIB, fits, memory_limit_gib, peak_memory_ladder
from ..cost.step import estimate_step_time, step_time_lower_bound, zero2_accumulation_floor
from ..errors import PartitaError
from ..estimate import Estimate
from ..plan import Plan
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from .layouts import EXPLAINED_KNOBS, LADDER_KNOBS, RECOMPUTE_ORDER, Layout, layouts_by_bound
from .space import SearchSpace



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

    @property
    def best(self) -> Estimate | None:
        return self.plans[0] if self.plans else None


def nearest_values(knob: str, mine, values) -> list:
    """The two values of ``knob`` closest to ``mine`` (log2 distance for degrees, list
    distance for modes): the alternatives the "why not" lines explain."""
    others = sorted({v for v in values if v != mine},
                    key=lambda v: (abs(knob_order(knob, v) - knob_order(knob, mine)), knob_order(knob, v)))
    return others[:2]


def knob_order(knob: str, value) -> float:
    """Position of a knob value on its axis: log2 for degrees, list index for modes."""
    if knob == "recompute":
        return ["none", "selective", "full"].index(value)
    return math.log2(value) if isinstance(value, int) and value > 0 else float(value)


class _Search:
    """The evaluation state shared by the two passes of :func:`search_plans`."""

    def __init__(self, model: ModelSpec, cluster: Cluster, usable: float, top: int):
        self.model, self.cluster, self.usable, self.top = model, cluster, usable, top
        self.attempts: list[Attempt] = []
        self.fitting: list[Estimate] = []
        self.evaluated = self.pruned = self.bounded = 0
        # Memory dominance, all else equal: it grows with mbs, shrinks with ep (> 1), and
        # shrinks with pp (> 1) at vpp = 1 - per-rank weights fall as 1/pp while the first
        # stage's in-flight activations stay ~constant (min(m, p) micro-batches of L/p
        # layers, m scaling with p at fixed devices), and interleaving only adds
        # activations. Once the leanest setting of a layout fails, every layout it
        # dominates fails too.
        self.failed: dict[tuple, list[tuple[int, int, int, int]]] = {}
        self.best_by_knob: dict[tuple[str, object], float] = {}
        self.plain_fails_from: dict[tuple, int] = {}  # smallest mbs at which no recompute-free setting fits
        self.tried: set[tuple[str, object]] = set()  # knob values with at least one attempt
        self.top_heap: list[float] = []  # negated step times of the best `top` rankable plans

    def kth_best(self) -> float:
        """The step time a plan must beat to enter the top K (inf until K plans are found)."""
        return -self.top_heap[0] if self.top and len(self.top_heap) >= self.top else float("inf")

    def dominated(self, plan: Plan) -> bool:
        return any(mbs_f <= plan.mbs and ep_f >= plan.ep and (plan.ep > 1 or ep_f == 1)
                   and ((pp_f == plan.pp and vpp_f == plan.vpp) or (vpp_f == 1 and pp_f >= plan.pp > 1))
                   for pp_f, vpp_f, ep_f, mbs_f in self.failed.get((plan.tp, plan.cp), ()))

    def evaluate(self, layout: Layout, wanted: list[tuple[str, object]] | None = None) -> None:
        """Memory of every ladder setting, then the estimate of the first that fits (per
        ZeRO group). ``wanted``: the knob values this evaluation is for (the second pass);
        None means the top-K ranking (the first pass). A wanted recompute or ZeRO value
        gets its own walk: the cheapest setting of the layout with that value."""
        layout.done = True
        base, ladder = layout.plan, layout.ladder
        if self.dominated(base) and (wanted is None or all(knob_value in self.tried for knob_value in wanted)):
            self.pruned += 1
            return
        # the setting with the least memory first: if even that does not fit, no setting does
        leanest = max(ladder, key=lambda st: (st[1], RECOMPUTE_ORDER[st[0]]))
        self.evaluated += 1
        self.tried.update(layout.knob_values)
        peak_bytes, peak_rank = peak_memory_ladder(self.model, self.cluster.device, base, [leanest])[leanest]
        if not fits(peak_bytes, self.usable):
            self.attempts.append(Attempt(plan=base.with_(recompute=leanest[0], zero=leanest[1]),
                                         peak_gib=peak_bytes / GIB, peak_rank=peak_rank, memory_limit_gib=self.usable))
            self.failed.setdefault((base.tp, base.cp), []).append((base.pp, base.vpp, base.ep, base.mbs))
            return
        if self._needs_recompute_or_zero3(layout, leanest, wanted):
            return
        peaks = peak_memory_ladder(self.model, self.cluster.device, base, ladder)  # all settings share the work
        counted = {leanest}
        estimated: list[Plan] = []
        if wanted is None or any(k not in LADDER_KNOBS for k, _ in wanted):
            # walk each ladder (zero <= 2, then zero 3) in order of cost; keep the first fit
            # of each. ZeRO-3 only adds communication to the same compute, so it is only
            # worth trying with a lighter recompute than the zero <= 2 ladder needed.
            heaviest = 3
            for group in ([st for st in ladder if st[1] < 3], [st for st in ladder if st[1] == 3]):
                for step in group:
                    weight = RECOMPUTE_ORDER[step[0]]
                    if step[1] == 3 and weight >= heaviest:
                        break
                    if self._try(layout, step, peaks, counted, wanted, estimated):
                        if step[1] < 3:
                            heaviest = weight
                        break
        for knob, value in wanted or ():
            if knob in LADDER_KNOBS and not any(getattr(p, knob) == value for p in estimated):
                index = LADDER_KNOBS.index(knob)
                for step in (st for st in ladder if st[index] == value):
                    if self._try(layout, step, peaks, counted, [(knob, value)], estimated):
                        break

    def _needs_recompute_or_zero3(self, layout: Layout, leanest: tuple[str, int], wanted) -> bool:
        """True (and counted as bounded) when no recompute-free ZeRO <= 2 setting fits and
        the cheapest settings left - recompute with ZeRO <= 2, or ZeRO-3 - are bounded
        out. Many layouts with a low bound only fit with recompute or ZeRO-3; this rules
        them out with one memory figure and two bounds instead of the whole ladder."""
        if wanted is not None and any(k in LADDER_KNOBS for k, _ in wanted):
            return False
        plain = [st for st in layout.ladder if st[0] == "none" and st[1] < 3]
        if not plain or plain[-1] == leanest:
            return False
        base = layout.plan
        # activation memory grows with mbs, all else equal: once a recompute-free setting
        # fails at some mbs, it fails at every larger one
        shape_key = (base.tp, base.cp, base.pp, base.vpp, base.ep, base.dp)
        if base.mbs < self.plain_fails_from.get(shape_key, 1 << 30):
            lightest = max(plain, key=lambda st: st[1])  # the recompute-free setting with the least memory
            peak_bytes, _ = peak_memory_ladder(self.model, self.cluster.device, base, [lightest])[lightest]
            if fits(peak_bytes, self.usable):
                return False
            self.plain_fails_from[shape_key] = base.mbs
        # the first setting of each family left: more recompute (ZeRO <= 2) or ZeRO-3;
        # later settings of a family only add time
        rest = [st for st in layout.ladder if st not in plain]
        firsts = [next(st for st in rest if (st[1] == 3) == z3) for z3 in (False, True) if any((st[1] == 3) == z3 for st in rest)]
        lb = min(step_time_lower_bound(self.model, self.cluster, layout.plan.with_(recompute=rc, zero=z)) for rc, z in firsts)
        if self._rules_out(layout, lb, wanted):
            self.bounded += 1
            return True
        return False

    def _try(self, layout: Layout, step: tuple[str, int], peaks: dict, counted: set,
             wanted: list[tuple[str, object]] | None, estimated: list[Plan]) -> bool:
        """One ladder setting: an attempt, and the estimate if it fits and can matter.
        True when it fits (estimated or bounded)."""
        plan = layout.plan.with_(recompute=step[0], zero=step[1])
        if step not in counted:
            counted.add(step)
            self.evaluated += 1
        pb, pr = peaks[step]
        attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr, memory_limit_gib=self.usable)
        self.attempts.append(attempt)
        if not fits(pb, self.usable):
            return False
        if self._cannot_matter(layout, plan, wanted):
            attempt.bounded = True
            self.bounded += 1
            return True
        self._record(Estimate(model=self.model, cluster=self.cluster, plan=plan,
                              time=estimate_step_time(self.model, self.cluster, plan), memory_limit=self.usable),
                     layout.rankable)
        attempt.estimate = self.fitting[-1]
        estimated.append(plan)
        return True

    def bound_for(self, layout: Layout, knob_value: tuple[str, object]) -> float:
        """The layout's lower bound for plans with ``knob_value`` (a (knob, value) pair):
        with that recompute mode for a recompute value, with ZeRO-3's gathers for zero 3
        (each only adds time), else the layout's own."""
        if knob_value not in (("recompute", "selective"), ("recompute", "full"), ("zero", 3)) \
                or layout.bound >= self.best_by_knob.get(knob_value, float("inf")):
            return layout.bound
        knob, value = knob_value
        return step_time_lower_bound(self.model, self.cluster, layout.plan.with_(**{knob: value}))

    def _cannot_matter(self, layout: Layout, plan: Plan, wanted) -> bool:
        """True when the plan's lower bound shows it can change neither the top K (first
        pass) nor the best plan of any knob value it is evaluated for (second pass)."""
        if wanted is None and (not layout.rankable or self.kth_best() == float("inf")):
            return False
        if plan.recompute == "none" and plan.zero < 3:
            lb = layout.bound  # the layout's bound is this plan's
        else:
            lb = step_time_lower_bound(self.model, self.cluster, plan)
        lb += zero2_accumulation_floor(self.model, self.cluster, plan)  # ZeRO-2's per-micro-batch reduce-scatters
        return self._rules_out(layout, lb, wanted)

    def _rules_out(self, layout: Layout, lb: float, wanted) -> bool:
        if wanted is None:
            return layout.rankable and lb >= self.kth_best()
        return all(lb >= self.best_by_knob.get(knob_value, float("inf")) for knob_value in wanted)

    def _record(self, est: Estimate, rankable: bool) -> None:
        self.fitting.append(est)
        t = est.step_time_s
        for knob_value in ((k, getattr(est.plan, k)) for k in EXPLAINED_KNOBS):
            if t < self.best_by_knob.get(knob_value, float("inf")):
                self.best_by_knob[knob_value] = t
        if rankable and self.top:
            if len(self.top_heap) < self.top:
                heapq.heappush(self.top_heap, -t)
            elif t < -self.top_heap[0]:
                heapq.heapreplace(self.top_heap, -t)


def search_plans(model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int,
                 space: SearchSpace | None = None, top: int = 5, cross_node_tp: bool = True) -> SearchResult:
    """Search the whole plan space for ``model`` on ``cluster``; best plans first.

    Branch and bound in two passes over the layouts sorted by their lower bound
    (:func:`step_time_lower_bound`): the first evaluates layouts until the next bound is
    no better than the K-th best plan found - every later layout is provably slower; the
    second finds, for each knob, the best plan at the two values nearest the winner's
    (the "why not" alternatives), again stopping each where the bound rules it out."""
    space = space or SearchSpace()
    t0 = time.perf_counter()
    dev = cluster.device
    if not dev.supports(space.dtype):
        dev.peak_flops(space.dtype)  # raises the one-line error
    usable = memory_limit_gib(dev, space.memory_headroom, space.max_memory_gib)
    invalid: list[str] = []
    layouts = layouts_by_bound(model, cluster, global_batch, seq_len, space, cross_node_tp, invalid)
    search = _Search(model, cluster, usable, top)
    for layout in layouts:
        if layout.rankable:
            if layout.bound >= search.kth_best():
                break
            search.evaluate(layout)
    if not search.fitting:  # nothing fits: every layout counts for the smallest memory reached
        for layout in layouts:
            if not layout.done:
                search.evaluate(layout)
    alternatives: dict[str, list] = {}
    if search.fitting:
        best = min((e for e in search.fitting if space.tp or e.plan.tp <= cluster.devices_per_node),
                   key=lambda e: e.step_time_s, default=None)
        if best is not None:
            values: dict[str, set] = {knob: set() for knob in EXPLAINED_KNOBS}
            for knob, value in {knob_value for lay in layouts for knob_value in lay.knob_values}:
                values[knob].add(value)
            for knob in EXPLAINED_KNOBS:
                alternatives[knob] = nearest_values(knob, getattr(best.plan, knob), values[knob])
            targets = {(k, v) for k, vs in alternatives.items() for v in vs}
            for layout in layouts:
                if layout.done:
                    continue
                if layout.bound >= max(search.best_by_knob.get(knob_value, float("inf")) for knob_value in targets):
                    break  # sorted by bound: no later layout can improve any alternative
                wanted = [knob_value for knob_value in layout.knob_values if knob_value in targets
                          and search.bound_for(layout, knob_value) < search.best_by_knob.get(knob_value, float("inf"))]
                if wanted:
                    search.evaluate(layout, wanted)
    skipped = sum(1 for lay in layouts if not lay.done)
    fitting = sorted(search.fitting, key=lambda e: e.step_time_s)
    # keep tp groups inside a node for the ranking unless the user fixed tp; cross-node
    # candidates stay in `attempts` for the explanations
    ranked = [e for e in fitting if space.tp or e.plan.tp <= cluster.devices_per_node]
    return SearchResult(model=model, cluster=cluster, plans=ranked[:top] if top else ranked, attempts=search.attempts,
                        candidates_evaluated=search.evaluated, candidates_pruned=search.pruned,
                        candidates_bounded=search.bounded + skipped, search_time_s=time.perf_counter() - t0,
                        memory_limit_gib=usable, invalid=invalid, alternatives=alternatives)


def infeasible_message(result: SearchResult) -> str:
    """Why nothing fits, the smallest memory any plan reaches, and what would change that."""
    if not result.attempts:
        reason = result.invalid[0] if result.invalid else "no layout divides the devices and the global batch"
        raise PartitaError(f"no valid plan for {result.model.name} on {result.cluster.world_size} devices: {reason}")
    smallest = min(result.attempts, key=lambda a: a.peak_gib)
    hints = []
    if not any(a.plan.zero == 3 for a in result.attempts):
        hints.append("allow zero-3")
    if not any(a.plan.recompute == "full" for a in result.attempts):
        hints.append("allow full recompute")
    need = smallest.peak_gib / result.memory_limit_gib
    hints.append(f"about {need:.1f}x the devices ({int(result.cluster.world_size * need + 0.999)}+) or devices with more memory")
    hints.append("optimizer offload (not modelled)")
    return (f"no plan fits: the smallest any plan reaches is {smallest.peak_gib:.1f} GiB per device "
            f"({smallest.plan.summary()}) > {result.memory_limit_gib:.1f} GiB usable; try: " + "; ".join(hints))
