"""Enumerate, prune by memory, rank by predicted step time - a branch and bound.

Every structural layout (tp, cp, pp, dp, ep, mbs, vpp and its layer split) gets a lower
bound of the step time of any plan it can produce (:func:`step_time_lower_bound`:
per-micro-batch compute and communication through the pipeline, no recompute). Layouts
come out of a queue in bound order (:class:`.layouts.LayoutQueue`); once the next bound
is no better than the K-th best plan found, every later layout is provably slower and
the first pass stops. A second pass (:mod:`.why_not`) finds the best plan at the two
values nearest the winner's of every knob (the "why not" alternatives), with the same
rule per value, through the search's public methods.

Evaluating a layout first computes the memory of every memory-saving setting
(recompute none -> selective -> full, in three ZeRO families: zero <= 1, zero 2, zero
3). Its bound then rises to the least bound of the settings that fit (more recompute,
ZeRO-2's per-micro-batch reduce-scatters and ZeRO-3's gathers only add time), and the
layout goes back into the queue under that bound: most layouts that only fit with
recompute or sharding never come up again. A layout that does is walked: the first
setting that fits in each family is estimated, unless its own bound rules it out.
Memory dominance rules out layouts that cannot fit without evaluating them. Every
memory evaluation of a setting is counted in ``candidates_evaluated``; layouts and
settings ruled out by a bound in ``candidates_pruned`` (memory) and
``candidates_bounded`` (time).

Partial recompute (``SearchSpace.partial_recompute``, on by default): a family whose
first fit recomputes (selective or full) also stands for its full-recompute plan with the
fewest recomputed layers per chunk that fit (``recompute_layers`` N, solved from the
linear memory). Its floor is the lesser of the setting's bound and that plan's
(:func:`.partial_recompute.partial_lower_bound`, at N >= 1 when first filed, at the solved N when the
layout comes up again); the partial plan is estimated unless its bound rules it out. The
ranking pass is exact against tests/brute_force_search.py, which enumerates every N; the
"why not" pass does not hunt partial plans (it reuses those the ranking estimated).

Module lists (``SearchSpace.module_lists``, on under ``partita plan --framework megatron/mindspeed``):
a family whose first fit recomputes also stands for its selective plan with the first of Megatron's
cumulative ``--recompute-modules`` lists that fits (:func:`.recompute_modules.candidate_lists`: each
list reruns a superset of the one before, so the first that fits is the fastest that fits), and the
next ones while a list fits only at risk (:meth:`_Search.module_fits`). Its floor takes the lesser of
the other bounds and that plan's (:func:`step_time_lower_bound` of the cheapest list when first filed,
of the first list that fits when the layout comes up again); a list only adds recompute over
``recompute="none"``, so the layout's own bound still bounds it. With recompute fixed to selective
(no full recompute on the ladder) a selective setting fits when a list does. Ranking pass only.

Memory risk (issue 33, :mod:`partita.uncertainty`, docs/planning.md "Intervals and P(fit)"):
"fits" above means P(fit) >= ``min_p_fit`` - a predicted peak at most the admission limit,
one comparison per setting. A setting at risk (0 < P(fit) < 1) is estimated but does not end
its family's walk, nor cap later families: more recompute or sharding may rank better once
the risk is counted. The ranking key is step time / P(fit) (:func:`partita.uncertainty.risk_adjusted`),
never below the step time, so every step-time lower bound above bounds it too; the top-K heap
holds keys. Partial recompute's N is solved at P(fit) = 1. With ``risk=False`` the limit alone
decides and the key is the step time: the brute-force comparison above runs that way.
"""
from __future__ import annotations

import heapq
import time
from typing import Callable

from ..cost.memory import GIB, fits, peak_memory, peak_memory_ladder
from ..cost.step import after_pipeline_bound, estimate_step_time, step_time_lower_bound, zero2_accumulation_floor
from ..errors import PartitaError
from ..estimate import Estimate
from ..plan import Plan, validate
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from .. import uncertainty as unc
from .layouts import (EXPLAINED_KNOBS, LADDER_KNOBS, RECOMPUTE_ORDER, Layout, LayoutQueue, layouts_by_bound,
                      pipeline_depths)
from .partial_recompute import PartialPlans, partial_lower_bound
from .recompute_modules import candidate_lists, framework_refuses
from .result import Attempt, SearchResult
from .why_not import alternatives as why_not_alternatives
from .why_not import partial_neighbours
from .space import SearchSpace, carried_plan, fixed_vpp_problem


def family_firsts(ladder: list[tuple[str, int]], accept: Callable[[tuple[str, int]], bool],
                  uncap: Callable[[int], bool] | None = None) -> list[tuple[str, int]]:
    """The walk over a layout's memory-saving settings that :meth:`_Search._walk` and the
    floor of :meth:`_Search._memory_rules_out` share: each ZeRO family - zero <= 1, zero 2,
    zero 3 - in order of recompute, stopping at the first setting ``accept`` takes (it
    fits): within a family more recompute only adds time. Across families, at equal
    recompute, ZeRO-2 adds its per-micro-batch reduce-scatters to ZeRO <= 1's time and
    ZeRO-3 its gathers to both, so a later family is only walked up to a lighter
    recompute than the earlier ones needed. ``accept`` is called on each setting walked,
    in order; the settings it took are returned.

    With partial recompute (``SearchSpace.partial_recompute``) a recomputing first fit
    (selective or full) need not cap a later family: each family also has a partial
    full-recompute plan (``recompute_layers`` N) whose time lies between none and full,
    and a later family's smaller N (ZeRO-2/3 free memory) can beat the earlier family's
    larger one. ``uncap(zero)`` says whether the family of that ZeRO stage is walked to
    full recompute regardless (its partial plan may still matter; likewise its module-list
    plan, ``SearchSpace.module_lists``: ZeRO-2/3 free memory, so a later family's list can
    rerun less than the earlier family's); a first fit without recompute caps every later family."""
    firsts: list[tuple[str, int]] = []
    full = len(RECOMPUTE_ORDER)
    limit = full
    for family in ((0, 1), (2,), (3,)):
        cap = full if (uncap is not None and 0 < limit < full and uncap(family[0])) else limit
        for step in (st for st in ladder if st[1] in family):
            weight = RECOMPUTE_ORDER[step[0]]
            if weight >= cap:
                break
            if accept(step):
                firsts.append(step)
                limit = min(limit, weight)
                break
    return firsts


class _Risk:
    """The memory risk of a search (:mod:`partita.uncertainty`): the named limit, the class of
    memory residuals, the admission limit (largest predicted peak with P(fit) >= min_p_fit:
    only plans above it are discarded) and the confident limit (P(fit) = 1)."""

    def __init__(self, limit: unc.MemoryLimit, residuals: unc.Residuals | None, min_p_fit: float | None):
        self.limit, self.residuals = limit, residuals
        self.min_p_fit = unc.DEFAULT_MIN_P_FIT if min_p_fit is None else min_p_fit
        if residuals is None:  # no risk: the limit alone decides (P(fit) 1 within it, 0 over it)
            self.admission_gib = self.confident_gib = limit.gib
        else:
            self.admission_gib = unc.admission_limit(limit.gib, residuals, self.min_p_fit)
            self.confident_gib = min(unc.confident_limit(limit.gib, residuals), self.admission_gib)

    @classmethod
    def none(cls, limit_gib: float) -> "_Risk":
        return cls(unc.MemoryLimit(limit_gib, limit_gib), None, None)

    def p_fit(self, peak_gib: float) -> float:
        if self.residuals is None:
            return 1.0 if peak_gib <= self.limit.gib else 0.0
        return unc.p_fit(peak_gib, self.limit.gib, self.residuals)


class _Search:
    """The evaluation state shared by the two passes of :func:`search_plans`."""

    def __init__(self, model: ModelSpec, cluster: Cluster, usable: float, top: int, partial: bool = False,
                 risk: "_Risk | None" = None, module_lists: tuple[str, ...] = (), lists_stand_in: bool = False):
        # usable: the admission limit - the largest predicted peak with P(fit) >= min_p_fit
        self.model, self.cluster, self.usable, self.top = model, cluster, usable, top
        self.risk = risk or _Risk.none(usable)
        self.partial = partial  # SearchSpace.partial_recompute
        self.attempts: list[Attempt] = []
        self.fitting: list[Estimate] = []
        self.evaluated = self.pruned = self.bounded = 0
        # Memory dominance, all else equal: it grows with mbs, shrinks with ep (> 1), and
        # shrinks with pp (> 1) at vpp = 1 - per-rank weights fall as 1/pp while the first
        # stage's in-flight activations stay ~constant (min(m, p) micro-batches of L/p
        # layers, m scaling with p at fixed devices), and interleaving only adds
        # activations. Once the leanest setting of a layout fails, every layout it
        # dominates fails too.
        self.failed: dict[tuple, list[tuple[int, int, int, int, int, str]]] = {}
        self.best_by_knob: dict[tuple[str, object], float] = {}
        self.tried: set[tuple[str, object]] = set()  # knob values with at least one attempt
        self.top_heap: list[float] = []  # negated step times of the best `top` rankable plans
        # Per-layout memos, keyed by the layout's id (every layout lives as long as the search
        # and its plan is frozen) and by the fields its settings vary (recompute, zero,
        # recompute_layers) - one table per quantity. What the cost formulas read of a plan
        # is keyed inside them by the cost model's frozen shapes (partita.cost.shape).
        self._bounds: dict[tuple[int, str, int], float] = {}  # setting_bound: (id(layout), recompute, zero)
        self._partial_bounds: dict[tuple[int, int, int], float] = {}  # partial_bound: (id(layout), zero, n)
        self._after: dict[int, float] = {}  # after_pipeline_bound (reads neither recompute nor zero)
        self._zero2_floors: dict[int, float] = {}  # zero2_accumulation_floor (reads no recompute)
        self._firsts: dict[tuple[int, bool], list] = {}  # _family_firsts' memo: (id(layout), partial)
        self.ranking_open = True  # estimates enter the ranking (first pass), else only explain
        self.estimated_steps: set[tuple[int, tuple[str, int]]] = set()  # (id(layout), setting) estimated
        # each layout's least N per zero, at P(fit) = 1 (an N at the admission limit would be the
        # riskiest plan of the family; fewer-but-risky N are not hunted)
        self.partial_plans = PartialPlans(model, cluster.device, self.risk.confident_gib)
        self.refined: set[int] = set()  # id(layout) of layouts whose floor has the solved partial N
        self.partial_estimated: set[tuple[int, int]] = set()  # (id(layout), zero) whose partial plan is estimated
        self.module_lists = module_lists  # SearchSpace.module_lists: Megatron's lists, cumulative
        # recompute fixed to selective (no full on the ladder): a selective setting whose default list
        # does not fit still fits when one of Megatron's lists does (_fits_step)
        self.lists_stand_in = lists_stand_in and bool(module_lists)
        # (id(layout), zero) -> (plan, peak bytes, rank) of the lists that can rank (module_fits)
        self._module_fits: dict[tuple[int, int], list[tuple[Plan, float, int]]] = {}
        self._module_bounds: dict[tuple[int, str, int], float] = {}  # (id(layout), list, zero)
        self.modules_estimated: set[tuple[int, int]] = set()  # (id(layout), zero) whose list plan is settled

    def close_ranking(self, layouts: LayoutQueue) -> None:
        """End the first pass (the "why not" pass, :func:`.why_not.alternatives`, calls
        this): later estimates only explain, and partial plans are no longer hunted, so
        the floors of the layouts left waiting drop their partial plans' bounds."""
        self.ranking_open = False
        # partial recompute is not hunted for the "why not" values: it made this pass 40 % of
        # DeepSeek-V3's search time (bench/search_speed.py) for lines that explain a knob; the
        # partial plans the ranking pass estimated still serve them, and every other plan of a
        # value is found exactly as without partial recompute
        self.partial = False
        self.module_lists = ()  # nor module lists (the same reason; the ranking's list plans still explain)
        for lay in layouts.layouts:  # the floors without partial plans: what this pass can find
            if lay.peaks is not None and not lay.done:
                if self._family_firsts(lay):
                    lay.floor = max(lay.floor, self._least_first_bound(lay, self.setting_bound))

    def kth_best(self) -> float:
        """The risk-adjusted step time (:func:`partita.uncertainty.risk_adjusted`) a plan must
        beat to enter the top K (inf until K plans are found)."""
        return -self.top_heap[0] if self.top and len(self.top_heap) >= self.top else float("inf")

    def dominated(self, plan: Plan) -> bool:
        # etp: only within one etp value (it divides the expert states but gathers etp
        # times the routed inputs, so memory is not monotone in it)
        return any(mbs_f <= plan.mbs and ep_f >= plan.ep and (plan.ep > 1 or ep_f == 1) and etp_f == plan.etp
                   and ((pp_f == plan.pp and vpp_f == plan.vpp and sched_f == plan.schedule)
                        or (vpp_f == 1 and pp_f >= plan.pp > 1))  # DualPipeV holds more than 1F1B deeper
                   for pp_f, vpp_f, ep_f, mbs_f, etp_f, sched_f in self.failed.get((plan.tp, plan.cp), ()))

    def evaluate(self, layout: Layout, wanted: list[tuple[str, object]] | None = None) -> bool:
        """Memory of the layout's settings, then the estimate of the first that fits in
        each ZeRO family. ``wanted``: the knob values this evaluation is for (the second
        pass); None means the top-K ranking (the first pass). A wanted recompute or ZeRO
        value gets its own walk: the cheapest setting of the layout with that value.

        In two steps. First the memory of every setting (:meth:`_memory_rules_out`): when
        only settings with recompute, ZeRO-2 or ZeRO-3 fit, the layout's floor rises to
        the least bound of those and True is returned - the layout waits in the queue
        under that floor, and is walked (the second step) only if it comes up again
        before the search stops; most never do. A layout walked or bounded out in the
        first pass stays open (``done`` False) for the second, which walks it again for
        the "why not" values the first did not settle."""
        base, ladder = layout.plan, layout.ladder
        layout.done = True
        if layout.peaks is None:
            if self._memory_rules_out(layout, wanted):
                return False
            if layout.waiting:
                return True
        elif layout.waiting:
            layout.waiting = False
            if (self.partial or self.module_lists) and self._refine_floor(layout, wanted):
                return True
            if self._rules_out(layout, layout.floor, wanted):  # the floor bounds every plan that fits
                self.bounded += 1
                layout.done = wanted is not None
                return False
        peaks = layout.peaks
        estimated: list[Plan] = []
        bounded = self.bounded
        if wanted is None or any(k not in LADDER_KNOBS for k, _ in wanted):
            self._walk(layout, peaks, wanted, estimated)
        for knob, value in wanted or ():
            if knob in LADDER_KNOBS and not any(getattr(p, knob) == value for p in estimated):
                index = LADDER_KNOBS.index(knob)
                for step in (st for st in ladder if st[index] == value):
                    if self._try(layout, step, peaks, [(knob, value)], estimated):
                        break
        if wanted is None:
            # the second pass may walk the layout again for the "why not" values whose best
            # plan in this layout the first walk did not settle
            layout.done = False
            layout.resolved = set() if self.bounded > bounded else self._settled(layout, peaks, estimated)
        return False

    def _settled(self, layout: Layout, peaks: dict, estimated: list[Plan]) -> set[tuple[str, object]]:
        """The knob values whose best plan in the layout a first-pass walk with nothing
        bounded out has found: its structural values (the best plan of the layout is
        among the walk's estimates), the recompute mode and ZeRO stage of each estimate
        (each is the first fit of its family, so the fastest plan with its mode and its
        stage), and the values no setting that fits has."""
        settled = {kv for kv in layout.knob_values if kv[0] not in LADDER_KNOBS}
        settled.update(kv for plan in estimated for kv in (("recompute", plan.recompute), ("zero", plan.zero)))
        fitting = [st for st in layout.ladder if fits(peaks[st][0], self.usable)]
        settled.update(kv for kv in layout.knob_values if kv[0] in LADDER_KNOBS
                       and not any(st[LADDER_KNOBS.index(kv[0])] == kv[1] for st in fitting))
        return settled

    def _memory_rules_out(self, layout: Layout, wanted) -> bool:
        """The first step of :meth:`evaluate`: True when memory dominance, the leanest
        setting's memory or the floor of the settings that fit rules the layout out.
        Else the memory of every setting is kept on the layout, and ``layout.waiting`` is
        set when the floor rose (the layout should wait in the queue)."""
        base, ladder = layout.plan, layout.ladder
        if layout.primary and self.dominated(base) \
                and (wanted is None or all(knob_value in self.tried for knob_value in wanted)):
            self.pruned += 1
            return True
        # every setting at once (they share most of the work); the one with the least
        # memory first: if even that does not fit, no setting does
        peaks = peak_memory_ladder(self.model, self.cluster.device, base, ladder)
        self.evaluated += len(ladder)
        self.tried.update(layout.knob_values)
        leanest = max(ladder, key=lambda st: (st[1], RECOMPUTE_ORDER[st[0]]))
        peak_bytes, peak_rank = peaks[leanest]
        if not fits(peak_bytes, self.usable) and not (self.lists_stand_in and self.module_fits(layout, leanest[1])):
            self.attempts.append(Attempt(plan=base.with_(recompute=leanest[0], zero=leanest[1]),
                                         peak_gib=peak_bytes / GIB, peak_rank=peak_rank, memory_limit_gib=self.usable))
            if layout.primary:  # the dominance rules reason about the structure's own split
                self.failed.setdefault((base.tp, base.cp), []).append((base.pp, base.vpp, base.ep, base.mbs, base.etp,
                                                                       base.schedule))
            return True
        layout.peaks = peaks
        floor = max(layout.floor, self._least_first_bound(layout))
        if floor > layout.floor:
            layout.floor = floor
            if self._rules_out(layout, floor, wanted):
                self.bounded += 1
                layout.done = wanted is not None  # bounded by the top K only: the second pass may want it
                return True
            layout.waiting, layout.done = True, False
        return False

    def _least_first_bound(self, layout: Layout, bound: Callable[..., float] | None = None) -> float:
        """``min`` of :meth:`_first_bound` (or ``bound``) over the family firsts, as far as
        the caller's ``max(layout.floor, ...)`` can tell: once one bound is at or below
        the floor the max is the floor whatever the others are, so they are not computed
        (each is a pure memoised bound; the no-recompute zero <= 2 ones, which equal the
        layout's bound, come first)."""
        bound = bound or (lambda lay, recompute, zero: self._first_bound(lay, (recompute, zero)))
        firsts = self._family_firsts(layout)
        if not firsts:
            return min(firsts)  # ValueError, as min() of no bounds
        firsts = sorted(firsts, key=lambda st: not (st[0] == "none" and st[1] < 3))  # stable
        least = float("inf")
        for step in firsts:
            lb = bound(layout, *step)
            if lb <= layout.floor:
                return lb
            least = min(least, lb)
        return least

    def _family_firsts(self, layout: Layout) -> list[tuple[str, int]]:
        """The settings :meth:`_walk` can estimate: the first that fits of each ZeRO family,
        a later family only with a lighter recompute than the earlier ones needed (at
        equal recompute ZeRO-2 and ZeRO-3 only add time). Every plan of the layout that
        fits is at least as slow as one of them."""
        # the peaks, once set, and the limit never change
        key = (id(layout), self.partial or bool(self.module_lists))
        firsts = self._firsts.get(key)
        if firsts is None:
            firsts = self._firsts[key] = family_firsts(
                layout.ladder, lambda step: self._fits_step(layout, step),
                (lambda zero: True) if key[1] else None)
        return firsts

    def _fits_step(self, layout: Layout, step: tuple[str, int]) -> bool:
        """Whether a ladder setting fits; with recompute fixed to selective (``lists_stand_in``) a
        selective setting also fits when one of Megatron's module lists does (:meth:`module_fits`)."""
        return fits(layout.peaks[step][0], self.usable) or (
            self.lists_stand_in and step[0] == "selective" and bool(self.module_fits(layout, step[1])))

    def _refine_floor(self, layout: Layout, wanted) -> bool:
        """A waiting layout's floor came from partial plans bounded at N >= 1 (cheap, as
        :meth:`_memory_rules_out` sets it for every layout); when it comes up again, each
        family's least N is solved (:meth:`.partial_recompute.PartialPlans.get`) and the floor rises to the
        bound at that N. True when it rose: the layout waits again (or is bounded out),
        as after :meth:`_memory_rules_out`. Once per layout."""
        if id(layout) in self.refined:
            return False
        self.refined.add(id(layout))
        floor = max(layout.floor, min(self._first_bound(layout, st, exact=True) for st in self._family_firsts(layout)))
        if floor <= layout.floor:
            return False
        layout.floor = floor
        if self._rules_out(layout, floor, wanted):
            self.bounded += 1
            layout.done = wanted is not None
        else:
            layout.waiting, layout.done = True, False
        return True

    def _first_bound(self, layout: Layout, step: tuple[str, int], exact: bool = False) -> float:
        """Lower bound of the plans a family's first fit stands for: its own, and with
        partial recompute and a recomputing setting also the partial plan's (N >= 1), the
        lesser of the two (a partial plan can beat selective recompute, or lose to it)."""
        if step[0] != "none" and self.module_lists:  # the family's module-list plan (see module_bound)
            return min(self._first_bound_without_lists(layout, step, exact), self.module_bound(layout, step[1], exact))
        return self._first_bound_without_lists(layout, step, exact)

    def _first_bound_without_lists(self, layout: Layout, step: tuple[str, int], exact: bool = False) -> float:
        """:meth:`_first_bound` of the setting and its partial plan."""
        if not self.partial or step[0] == "none":
            return self.setting_bound(layout, *step)
        # full recompute of every layer is the partial plan at N = all layers: never below
        # the partial bound, so its own bound (a step-time bound each) is not needed
        own = self.setting_bound(layout, *step) if step[0] != "full" else float("inf")
        if not exact:
            return min(own, self.partial_bound(layout, step[1], 1))
        partial = self.partial_plans.get(layout, step[1])
        if partial is None:  # no partial plan fits: the setting alone
            return self.setting_bound(layout, *step)
        return min(own, self.partial_bound(layout, step[1], partial[0].recompute_layers))

    def partial_bound(self, layout: Layout, zero: int, n: int) -> float:
        """Lower bound of the layout's partial plan recomputing ``n`` or more layers per
        chunk (memoised): :func:`partial_lower_bound` plus ZeRO-2's floor; zero 3 (its
        gathers' exposure depends on the stage's compute) gets the no-recompute bound."""
        key = (id(layout), zero, n)
        lb = self._partial_bounds.get(key)
        if lb is None:
            lb = self.setting_bound(layout, "none", zero)
            if zero < 3:
                plan = layout.plan.with_(recompute="full", recompute_layers=n, zero=zero)
                zero2 = self._zero2_floor(layout) if zero == 2 else 0.0
                lb = max(lb, partial_lower_bound(self.model, self.cluster, plan, layout.bound) + zero2)
            self._partial_bounds[key] = lb
        return lb

    def module_fits(self, layout: Layout, zero: int) -> list[tuple[Plan, float, int]]:
        """(plan, peak bytes, rank) of the layout's selective plans at ``zero`` with the module lists
        that can rank (memoised; each list's memory counts as a candidate evaluated): the first list
        that fits and, while a list fits only at risk (P(fit) < 1), the next ones up to the first that
        fits confidently - as a ladder setting at risk does not end its family's walk (more recompute
        may rank better once the risk is counted). The lists are cumulative
        (:func:`.recompute_modules.candidate_lists`), so a later confident list only reruns more.
        A list that fails Megatron's rules for the plan (:func:`partita.plan.validate`) or that the
        framework's export refuses (:func:`.recompute_modules.framework_refuses`) is passed over."""
        key = (id(layout), zero)
        found = self._module_fits.get(key)
        if found is None:
            found = self._module_fits[key] = []
            for modules in self.module_lists:
                plan = layout.plan.with_(recompute="selective", recompute_layers=0, recompute_modules=modules,
                                         zero=zero)
                pb, pr = peak_memory(self.model, self.cluster.device, plan)
                self.evaluated += 1
                if fits(pb, self.usable) and not validate(plan, self.model) \
                        and not framework_refuses(plan, self.model):
                    found.append((plan, pb, pr))
                    if pb / GIB <= self.risk.confident_gib:
                        break
        return found

    def module_bound(self, layout: Layout, zero: int, exact: bool = False, modules: str | None = None) -> float:
        """Lower bound of the layout's module-list plans at ``zero``: :func:`step_time_lower_bound`
        of the plan with the cheapest list (``exact`` False: no memory needed; every list reruns
        at least it), with the first list that fits (``exact``: inf when none fits) or with
        ``modules``, plus ZeRO-2's floor - as :meth:`setting_bound` prices a setting; never below
        the layout's bound without recompute (a list only adds recompute)."""
        if modules is None and not exact:
            modules = self.module_lists[0]
        elif modules is None:
            fitting = self.module_fits(layout, zero)
            if not fitting:
                return float("inf")
            modules = fitting[0][0].recompute_modules
        key = (id(layout), modules, zero)
        lb = self._module_bounds.get(key)
        if lb is None:
            after = self._after.get(id(layout))
            if after is None:
                after = self._after[id(layout)] = after_pipeline_bound(self.model, self.cluster, layout.plan)
            plan = layout.plan.with_(recompute="selective", recompute_modules=modules, zero=zero)
            own = step_time_lower_bound(self.model, self.cluster, plan, after)
            lb = max(self.setting_bound(layout, "none", zero), own + (self._zero2_floor(layout) if zero == 2 else 0.0))
            self._module_bounds[key] = lb
        return lb

    def _try_modules(self, layout: Layout, zero: int, wanted, estimated: list[Plan]) -> None:
        """The family's selective plans with the module lists that can rank (:meth:`module_fits`):
        each an attempt and - unless its bound rules it out - an estimate ranked beside the
        family's first fit. Once per (layout, zero) once its memory is known."""
        key = (id(layout), zero)
        if key in self.modules_estimated:
            return
        may_bound = (wanted is None and layout.rankable and self.kth_best() != float("inf")) or wanted is not None
        if may_bound and self._rules_out(layout, self.module_bound(layout, zero), wanted):
            self.bounded += 1  # bounded before its memory is computed; a later walk may try it again
            return
        self.modules_estimated.add(key)
        for plan, pb, pr in self.module_fits(layout, zero):
            attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr, memory_limit_gib=self.usable)
            self.attempts.append(attempt)
            if may_bound and self._rules_out(layout, self.module_bound(layout, zero, modules=plan.recompute_modules),
                                             wanted):
                attempt.bounded = True
                self.bounded += 1
                continue
            attempt.estimate = self._estimate(plan, pb)
            self._record(attempt.estimate, layout.rankable)
            estimated.append(plan)

    def _walk(self, layout: Layout, peaks: dict, wanted, estimated: list[Plan]) -> None:
        """Each ZeRO family - zero <= 1, zero 2, zero 3 - in order of recompute, keeping
        the first setting of each that fits (:func:`family_firsts`), each tried - and
        estimated if it can matter - by :meth:`_try`."""
        def uncap(zero: int) -> bool:  # the family's partial plan (N >= 1) or module-list plan may still matter
            may_bound = wanted is not None or (layout.rankable and self.kth_best() != float("inf"))
            if not may_bound:
                return True
            # a later family's list (ZeRO-2/3 free memory) can rerun less than the earlier family's
            return (self.partial and not self._rules_out(layout, self.partial_bound(layout, zero, 1), wanted)) or (
                bool(self.module_lists) and not self._rules_out(layout, self.module_bound(layout, zero), wanted))

        family_firsts(layout.ladder, lambda step: self._try(layout, step, peaks, wanted, estimated),
                      uncap if self.partial or self.module_lists else None)

    def setting_bound(self, layout: Layout, recompute: str, zero: int) -> float:
        """Lower bound of the layout's plan with this setting (memoised per layout):
        :func:`step_time_lower_bound`, plus ZeRO-2's per-micro-batch reduce-scatter floor
        (:func:`zero2_accumulation_floor`) for zero 2."""
        key = (id(layout), recompute, zero)
        lb = self._bounds.get(key)
        if lb is None:
            if recompute == "none" and zero < 3:
                lb = layout.bound  # the layout's bound is this plan's
            else:
                after = self._after.get(id(layout))
                if after is None:  # the same for every setting of the layout (recompute_layers 0)
                    after = self._after[id(layout)] = after_pipeline_bound(self.model, self.cluster, layout.plan)
                lb = step_time_lower_bound(self.model, self.cluster, layout.plan.with_(recompute=recompute, zero=zero),
                                           after)
            if zero == 2:
                lb += self._zero2_floor(layout)
            self._bounds[key] = lb
        return lb

    def _zero2_floor(self, layout: Layout) -> float:
        """:func:`zero2_accumulation_floor` of the layout at zero 2 (memoised per layout: it
        does not depend on the recompute mode, it takes the widest window)."""
        floor = self._zero2_floors.get(id(layout))
        if floor is None:
            floor = self._zero2_floors[id(layout)] = zero2_accumulation_floor(self.model, self.cluster,
                                                                              layout.plan.with_(zero=2))
        return floor

    def _try(self, layout: Layout, step: tuple[str, int], peaks: dict,
             wanted: list[tuple[str, object]] | None, estimated: list[Plan]) -> bool:
        """One ladder setting: an attempt, and the estimate if it fits and can matter.
        True when it fits (estimated or bounded)."""
        plan = layout.plan.with_(recompute=step[0], zero=step[1])
        # selective or full fits: recomputing only some layers fully may fit too, and be faster
        partial = self.partial and step[0] != "none"
        pb, pr = peaks[step]
        # a setting at risk (P(fit) < 1) is kept but does not end its family's walk: more
        # recompute or sharding may rank better once its risk is counted (unc.risk_adjusted)
        confident = pb / GIB <= self.risk.confident_gib
        lists = bool(self.module_lists) and step[0] != "none"  # its module-list plan (_try_modules)
        if (id(layout), step) in self.estimated_steps:  # estimated by an earlier walk of this layout
            if partial:
                self._try_partial(layout, plan, wanted, estimated)
            if lists:
                self._try_modules(layout, step[1], wanted, estimated)
            return confident
        attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr, memory_limit_gib=self.usable)
        self.attempts.append(attempt)
        if not fits(pb, self.usable):
            if lists and self.lists_stand_in and self.module_fits(layout, step[1]):  # only a list fits
                self._try_modules(layout, step[1], wanted, estimated)
                return self.module_fits(layout, step[1])[-1][1] / GIB <= self.risk.confident_gib
            return False
        if self._cannot_matter(layout, plan, wanted):
            attempt.bounded = True
            self.bounded += 1
            if partial:  # its partial plan has a lower bound: it may still matter
                self._try_partial(layout, plan, wanted, estimated)
            if lists:  # and so has its module-list plan
                self._try_modules(layout, step[1], wanted, estimated)
            return confident
        attempt.estimate = self._estimate(plan, pb)
        self._record(attempt.estimate, layout.rankable)
        estimated.append(plan)
        self.estimated_steps.add((id(layout), step))
        if partial:
            self._try_partial(layout, plan, wanted, estimated)
        if lists:
            self._try_modules(layout, step[1], wanted, estimated)
        return confident

    def _estimate(self, plan: Plan, peak_bytes: float) -> Estimate:
        """The estimate of a plan that is kept, with its limit and P(fit) (from the peak at hand)."""
        return Estimate(model=self.model, cluster=self.cluster, plan=plan,
                        time=estimate_step_time(self.model, self.cluster, plan), memory_limit=self.risk.limit,
                        min_p_fit=self.risk.min_p_fit, _p_fit=self.risk.p_fit(peak_bytes / GIB),
                        _p_fit_limit=self.risk.limit.gib)

    def _try_partial(self, layout: Layout, fitted: Plan, wanted, estimated: list[Plan]) -> None:
        """Recompute just enough: a layout that fits only with selective or full recompute
        also gets its full-recompute plan recomputing the fewest layers per stage that
        still fit (:func:`.partial_recompute.least_recompute_layers`, solved from the linear
        memory), as an attempt and - unless its bound (the layout's, without recompute)
        rules it out - an estimate ranked beside the fitted one. Fewer recomputed layers
        only take time off full recompute, and a few recomputed layers can cost less than
        selective recompute of every layer (tests/test_search.py's brute force finds
        such plans). Solved once per (layout, zero); later walks reuse the answer."""
        key = (id(layout), fitted.zero)
        if key in self.partial_estimated:
            return
        # its bound (the layout's without recompute) first: most partial plans are ruled
        # out before their N is solved
        may_bound = (wanted is None and layout.rankable and self.kth_best() != float("inf")) or wanted is not None
        bounded = may_bound and self._rules_out(layout, self.partial_bound(layout, fitted.zero, 1), wanted)
        if bounded and not self.partial_plans.solved(layout, fitted.zero):
            self.bounded += 1
            return
        partial = self.partial_plans.get(layout, fitted.zero)
        if partial is None:
            return
        plan, pb, pr = partial
        attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr, memory_limit_gib=self.usable)
        self.attempts.append(attempt)
        if bounded or (may_bound and self._rules_out(layout, self.partial_bound(layout, plan.zero, plan.recompute_layers),
                                                      wanted)):
            attempt.bounded = True
            self.bounded += 1
            return
        attempt.estimate = self._estimate(plan, pb)
        self._record(attempt.estimate, layout.rankable)
        estimated.append(plan)
        self.partial_estimated.add(key)

    def bound_for(self, layout: Layout, knob_value: tuple[str, object]) -> float:
        """The layout's lower bound for plans with ``knob_value`` (a (knob, value) pair):
        with that recompute mode for a recompute value, with ZeRO-3's gathers for zero 3
        (each only adds time), else the layout's own."""
        if knob_value not in (("recompute", "selective"), ("recompute", "full"), ("zero", 3)) \
                or layout.floor >= self.best_by_knob.get(knob_value, float("inf")):
            return layout.floor
        knob, value = knob_value
        bound = self.setting_bound(layout, value, layout.plan.zero) if knob == "recompute" else \
            self.setting_bound(layout, "none", 3)
        return max(bound, layout.floor)

    def _cannot_matter(self, layout: Layout, plan: Plan, wanted) -> bool:
        """True when the plan's lower bound shows it can change neither the top K (first
        pass) nor the best plan of any knob value it is evaluated for (second pass)."""
        if wanted is None and (not layout.rankable or self.kth_best() == float("inf")):
            return False
        return self._rules_out(layout, self.setting_bound(layout, plan.recompute, plan.zero), wanted)

    def _rules_out(self, layout: Layout, lb: float, wanted) -> bool:
        if wanted is None:
            return layout.rankable and lb >= self.kth_best()
        return all(lb >= self.best_by_knob.get(knob_value, float("inf")) for knob_value in wanted)

    def _record(self, est: Estimate, rankable: bool) -> None:
        if self.ranking_open:  # the first pass: the top-K ranking; later estimates only explain
            self.fitting.append(est)
        t = est.step_time_s
        # a plan whose tp group crosses nodes explains its tp value only (see .why_not.alternatives)
        for knob_value in ((k, getattr(est.plan, k)) for k in (EXPLAINED_KNOBS if rankable else ("tp",))):
            if t < self.best_by_knob.get(knob_value, float("inf")):
                self.best_by_knob[knob_value] = t
        if rankable and self.top and self.ranking_open:
            key = unc.risk_adjusted(t, est.p_fit)  # >= t: a step-time bound still bounds it
            if len(self.top_heap) < self.top:
                heapq.heappush(self.top_heap, -key)
            elif key < -self.top_heap[0]:
                heapq.heapreplace(self.top_heap, -key)


def search_plans(model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int,
                 space: SearchSpace | None = None, top: int = 5, cross_node_tp: bool = True,
                 min_p_fit: float | None = unc.DEFAULT_MIN_P_FIT, risk: bool = True) -> SearchResult:
    """Search the whole plan space for ``model`` on ``cluster``; best plans first.

    Branch and bound in two passes over the layouts sorted by their lower bound
    (:func:`step_time_lower_bound`): the first evaluates layouts until the next bound is
    no better than the K-th best plan found - every later layout is provably slower; the
    second finds, for each knob, the best plan at the two values nearest the winner's
    (the "why not" alternatives), again stopping each where the bound rules it out.

    With ``risk`` (the default) a plan is discarded only when P(fit) < ``min_p_fit``; plans at
    risk are kept and ranked by step time / P(fit) (:func:`partita.uncertainty.risk_adjusted`).
    ``risk=False``: the limit alone decides and plans rank by step time (the brute-force
    oracle's reading, tests/brute_force_search.py)."""
    space = space or SearchSpace()
    problem = fixed_vpp_problem(space, model.name, model.layers, cluster.world_size,  # said first: never enumerated
                                pipeline_depths(model, cluster, seq_len, space, cross_node_tp))  # (space.py)
    if problem:
        raise PartitaError(problem)
    t0 = time.perf_counter()
    dev = cluster.device
    if not dev.supports(space.dtype):
        dev.peak_flops(space.dtype)  # raises the one-line error
    limit = unc.MemoryLimit.of(dev, space.memory_headroom, space.max_memory_gib)
    residuals = unc.memory_residuals(model, seq_len, space.dtype, dev) if risk else None
    memory_risk = _Risk(limit, residuals, min_p_fit)
    usable = memory_risk.admission_gib
    invalid: list[str] = []
    layouts = layouts_by_bound(model, cluster, global_batch, seq_len, space, cross_node_tp, invalid)
    # partial recompute plans are full recompute of some layers: not when the user fixed selective
    # (before, `partita plan --recompute selective` proposed rc-full:N plans)
    partial = space.partial_recompute and space.recompute in (None, "full")
    # Megatron's module lists: selective plans (not when the user fixed full or no recompute, nor
    # when the user's own list is carried: that list is the user's choice)
    lists = space.module_lists and space.allow_recompute and space.recompute in (None, "selective") \
        and not space.options.get("recompute_modules")
    search = _Search(model, cluster, usable, top, partial, memory_risk,
                     tuple(candidate_lists(model)) if lists else (), lists_stand_in=space.recompute == "selective")
    for layout in layouts:
        if layout.rankable:
            if layout.floor >= search.kth_best():
                break
            if search.evaluate(layout):
                layouts.push(layout)  # it waits under its raised floor
    if not search.fitting:  # nothing fits: every layout counts for the smallest memory reached
        layouts = layouts.with_cross_node(True)
        for layout in layouts:
            if search.evaluate(layout):
                layouts.push(layout)
    alternatives: dict[str, list] = {}
    if search.fitting:
        best = min((e for e in search.fitting if space.tp or e.plan.tp <= cluster.devices_per_node),
                   key=_rank_key, default=None)
        if best is not None:
            alternatives, layouts = why_not_alternatives(search, layouts, best.plan, cluster.devices_per_node)
    # never evaluated, or left waiting under a floor the search never reached
    skipped = sum(1 for lay in layouts.layouts if lay.peaks is None and not lay.done) + len(layouts.deferred_structures)
    fitting = sorted(search.fitting, key=_rank_key)
    # keep tp groups inside a node for the ranking unless the user fixed tp; cross-node
    # candidates stay in `attempts` for the explanations
    ranked = [e for e in fitting if space.tp or e.plan.tp <= cluster.devices_per_node]
    if ranked and ranked[0].plan.recompute_layers:
        search.attempts += partial_neighbours(model, cluster, ranked[0].plan, memory_risk.confident_gib,
                                              search.attempts)
    if space.options.get("recompute_modules"):  # the user's module list: only selective candidates run it
        _drop_unused_modules(search.attempts, fitting)
    return SearchResult(model=model, cluster=cluster, plans=ranked[:top] if top else ranked, attempts=search.attempts,
                        candidates_evaluated=search.evaluated, candidates_pruned=search.pruned,
                        candidates_bounded=search.bounded + skipped, search_time_s=time.perf_counter() - t0,
                        memory_limit_gib=limit.gib, invalid=invalid, alternatives=alternatives, limit=limit,
                        admission_limit_gib=usable, min_p_fit=memory_risk.min_p_fit,
                        confident_limit_gib=memory_risk.confident_gib)


def _drop_unused_modules(attempts: list[Attempt], estimates: list[Estimate]) -> None:
    """Every candidate carries the user's ``recompute_modules`` while it is priced (the memory
    of its selective setting reads them); the plans returned keep them only with recompute
    selective (:func:`.space.carried_plan`): the list has no effect on none or full in the cost
    model nor in Megatron, and a plan with it and recompute full would not validate or export."""
    for attempt in attempts:
        attempt.plan = carried_plan(attempt.plan)
        if attempt.estimate is not None:
            attempt.estimate.plan = carried_plan(attempt.estimate.plan)
    for est in estimates:
        est.plan = carried_plan(est.plan)


def _rank_key(est: Estimate) -> tuple[float, float]:
    """The ranking: risk-adjusted step time, then step time."""
    return unc.risk_adjusted(est.step_time_s, est.p_fit), est.step_time_s


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
    need = smallest.peak_gib / result.admission_limit_gib if result.admission_limit_gib else \
        smallest.peak_gib / result.memory_limit_gib
    hints.append(f"about {need:.1f}x the devices ({int(result.cluster.world_size * need + 0.999)}+) or devices with more memory")
    if not result.attempts[0].plan.optimizer_offload:
        hints.append("optimizer offload (--optimizer-offload 1: its memory is modelled, its host step is not timed)")
    return (f"no plan fits: the smallest any plan reaches is {smallest.peak_gib:.1f} GiB per device "
            f"({smallest.plan.summary()}), P(fit) < {result.min_p_fit:g} against the "
            f"{result.limit.describe() if result.limit else f'{result.memory_limit_gib:.1f} GiB usable'}; try: "
            + "; ".join(hints))
