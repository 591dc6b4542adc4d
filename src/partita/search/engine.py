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
from functools import lru_cache

from ..cost.compute import layer_forward, output_forward
from ..cost.memory import GIB, peak_memory_ladder
from ..cost.step import estimate_step_time, step_time_lower_bound
from ..errors import PartitaError
from ..estimate import Estimate
from ..plan import Plan, balanced_split, validate
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from .space import SearchSpace, best_split, divisors, powers_of_two

LADDER = [("none", 1), ("none", 2), ("selective", 1), ("selective", 2), ("full", 1), ("full", 2)]
LADDER_Z3 = [("none", 3), ("selective", 3), ("full", 3)]
RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
EXPLAINED_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "mbs", "recompute", "zero")
LADDER_KNOBS = ("recompute", "zero")  # the memory-saving knobs walked per layout, in ladder-step order


@dataclass
class Attempt:
    """One evaluated candidate: its plan, memory, and (if it fits) its estimate."""

    plan: Plan
    peak_gib: float
    peak_rank: int
    estimate: Estimate | None = None
    bounded: bool = False  # fits, but provably slower than what the search already had

    @property
    def fits(self) -> bool:
        return self.estimate is not None or self.bounded


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


def _structures(model: ModelSpec, cluster: Cluster, gbs: int, seq: int, space: SearchSpace, cross_node_tp: bool):
    n, dpn = cluster.world_size, cluster.devices_per_node
    tps = [space.tp] if space.tp else [t for t in powers_of_two(dpn * (2 if cross_node_tp else 1)) if n % t == 0]
    for tp in tps:
        if model.heads % tp or (not model.mla and model.kv_heads % tp):
            continue
        cps = [space.cp] if space.cp else [c for c in powers_of_two(n // tp) if seq // c >= space.min_tokens_per_cp_rank
                                           and seq % (2 * c) == 0 or c == 1]
        for cp in cps:
            if (n // tp) % cp:
                continue
            rest = n // (tp * cp)
            # deepest pipeline first: memory per rank only grows as pp shrinks (see search_plans)
            pps = [space.pp] if space.pp else sorted((p for p in divisors(rest) if p <= model.layers), reverse=True)
            for pp in pps:
                if rest % pp:
                    continue
                dp = rest // pp
                if space.dp and dp != space.dp:
                    continue
                if gbs % dp:
                    continue
                per_replica = gbs // dp
                mbss = [space.mbs] if space.mbs else [b for b in divisors(per_replica)
                                                      if b * seq <= space.max_tokens_per_microbatch]
                eps = [1]
                if model.moe:  # largest first: less expert memory, so a failure prunes the smaller ones
                    eps = [space.ep] if space.ep else sorted((e for e in divisors(dp * cp) if model.moe.num_experts % e == 0),
                                                             reverse=True)
                vpps = [1]
                if pp > 1:
                    vpps = [space.vpp] if space.vpp else [v for v in range(1, min(space.max_vpp, (model.layers + 2) // pp) + 1)
                                                          if v == 1 or model.layers % (pp * v) == 0
                                                          or (model.layers + 2) % (pp * v) == 0]
                for ep in eps:
                    for mbs in mbss:
                        m = per_replica // mbs
                        for vpp in vpps:
                            if vpp > 1 and m % pp:
                                continue
                            yield tp, cp, pp, dp, ep, mbs, vpp


def _output_in_layers(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """The output layer's time in units of the last layer's (2 decimals), what the
    min-max split balances the last stage against."""
    layer = layer_forward(model, cluster.device, plan, bool(model.moe) and model.moe_flags[-1]).time
    out = output_forward(model, cluster.device, plan).time
    return round(out / layer, 2) if layer else 0.0


@lru_cache(maxsize=65536)
def _min_max_split(layers: int, chunks: int, last_extra: float) -> tuple[int, ...] | None:
    split = best_split(layers, chunks, 0.0, last_extra)
    if split and layers % chunks == 0 and max(split) >= layers // chunks:
        return None  # even split is as good
    return split or None


@dataclass
class _Layout:
    """One structural layout (degrees, mbs, vpp, split) with its memory-saving ladder and
    the lower bound of every plan it can produce."""

    plan: Plan
    ladder: list[tuple[str, int]]
    bound: float
    rankable: bool
    knob_values: tuple[tuple[str, object], ...]  # every (knob, value) its plans can have
    done: bool = False


def _ladder(space: SearchSpace, dp: int, cp: int) -> list[tuple[str, int]]:
    allow_z3 = space.allow_zero3 and dp * cp > 1
    ladder = [step for step in LADDER + (LADDER_Z3 if allow_z3 else [])
              if (not space.recompute or step[0] == space.recompute)
              and (space.allow_recompute or step[0] == "none")]
    ladder = [(rc, 0 if dp * cp == 1 and z < 3 else z) for rc, z in ladder]
    return [step for step in dict.fromkeys(ladder) if space.zero is None or step[1] == space.zero]


def _layouts(model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, space: SearchSpace,
             cross_node_tp: bool, invalid: list[str]) -> list[_Layout]:
    """Every valid layout, cheapest lower bound first (the search's hot loop: thousands
    of layouts, so what depends on few fields is computed once per value)."""
    layouts = []
    ladders = {replicated: _ladder(space, 2 if replicated else 1, 1) for replicated in (False, True)}
    ladder_values = {replicated: tuple([("recompute", rc) for rc in dict.fromkeys(rc for rc, _ in ladder)]
                                       + [("zero", z) for z in dict.fromkeys(z for _, z in ladder)])
                     for replicated, ladder in ladders.items()}
    output_ratio: dict[tuple, float] = {}  # depends on the layer shape only
    for tp, cp, pp, dp, ep, mbs, vpp in _structures(model, cluster, global_batch, seq_len, space, cross_node_tp):
        replicated = dp * cp > 1
        ladder = ladders[replicated]
        if not ladder:
            continue
        base = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=tp > 1, zero=1 if replicated else 0,
                    mbs=mbs, gbs=global_batch, seq_len=seq_len, dtype=space.dtype,
                    schedule="interleaved-1f1b" if vpp > 1 else "1f1b", **space.options)
        if pp * vpp > 1:
            # layer split: even when possible, else the exact min-max split (vpp = 1; the
            # last stage also carries the output layer) or Megatron's embedding-aware
            # balanced split (vpp > 1)
            if vpp > 1:
                split = None if model.layers % (pp * vpp) == 0 else balanced_split(model.layers, pp * vpp)
            else:
                shape_key = (tp, cp, ep, mbs)
                if shape_key not in output_ratio:
                    output_ratio[shape_key] = _output_in_layers(model, cluster, base)
                split = _min_max_split(model.layers, pp, output_ratio[shape_key])
            if split is not None:
                base = base.with_(layer_split=split)
        errs = validate(base, model, cluster.world_size)
        if errs:
            invalid.append(f"{base.summary()}: {errs[0]}")
            continue
        # no setting of the layout is faster than its terms with no recompute (base has none)
        bound = step_time_lower_bound(model, cluster, base)
        knobs = (("tp", tp), ("pp", pp), ("vpp", vpp), ("cp", cp), ("ep", ep), ("mbs", mbs)) + ladder_values[replicated]
        layouts.append(_Layout(base, ladder, bound, bool(space.tp) or tp <= cluster.devices_per_node, knobs))
    layouts.sort(key=lambda lay: lay.bound)  # stable: ties keep the enumeration order
    return layouts


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

    def evaluate(self, layout: _Layout, wanted: list[tuple[str, object]] | None = None) -> None:
        """Memory of every ladder setting, then the estimate of the first that fits (per
        ZeRO group). ``wanted``: the knob values this evaluation is for (the second pass);
        None means the top-K ranking (the first pass). A wanted recompute or ZeRO value
        gets its own walk: the cheapest setting of the layout with that value."""
        layout.done = True
        base, ladder = layout.plan, layout.ladder
        if self.dominated(base) and (wanted is None or all(kv in self.tried for kv in wanted)):
            self.pruned += 1
            return
        # the setting with the least memory first: if even that does not fit, no setting does
        leanest = max(ladder, key=lambda st: (st[1], RECOMPUTE_ORDER[st[0]]))
        self.evaluated += 1
        self.tried.update(layout.knob_values)
        peak_bytes, peak_rank = peak_memory_ladder(self.model, self.cluster.device, base, [leanest])[leanest]
        if peak_bytes / GIB > self.usable:
            self.attempts.append(Attempt(plan=base.with_(recompute=leanest[0], zero=leanest[1]),
                                         peak_gib=peak_bytes / GIB, peak_rank=peak_rank))
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

    def _needs_recompute_or_zero3(self, layout: _Layout, leanest: tuple[str, int], wanted) -> bool:
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
            if peak_bytes / GIB <= self.usable:
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

    def _try(self, layout: _Layout, step: tuple[str, int], peaks: dict, counted: set,
             wanted: list[tuple[str, object]] | None, estimated: list[Plan]) -> bool:
        """One ladder setting: an attempt, and the estimate if it fits and can matter.
        True when it fits (estimated or bounded)."""
        plan = layout.plan.with_(recompute=step[0], zero=step[1])
        if step not in counted:
            counted.add(step)
            self.evaluated += 1
        pb, pr = peaks[step]
        attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr)
        self.attempts.append(attempt)
        if attempt.peak_gib > self.usable:
            return False
        if self._cannot_matter(layout, plan, wanted):
            attempt.bounded = True
            self.bounded += 1
            return True
        self._record(Estimate(model=self.model, cluster=self.cluster, plan=plan,
                              time=estimate_step_time(self.model, self.cluster, plan)), layout.rankable)
        attempt.estimate = self.fitting[-1]
        estimated.append(plan)
        return True

    def bound_for(self, layout: _Layout, kv: tuple[str, object]) -> float:
        """The layout's lower bound for plans with ``kv``: with that recompute mode for a
        recompute value, with ZeRO-3's gathers for zero 3 (each only adds time), else the
        layout's own."""
        if kv not in (("recompute", "selective"), ("recompute", "full"), ("zero", 3)) \
                or layout.bound >= self.best_by_knob.get(kv, float("inf")):
            return layout.bound
        return step_time_lower_bound(self.model, self.cluster, layout.plan.with_(**{kv[0]: kv[1]}))

    def _cannot_matter(self, layout: _Layout, plan: Plan, wanted) -> bool:
        """True when the plan's lower bound shows it can change neither the top K (first
        pass) nor the best plan of any knob value it is evaluated for (second pass)."""
        if wanted is None and (not layout.rankable or self.kth_best() == float("inf")):
            return False
        if plan.recompute == "none" and plan.zero < 3:
            lb = layout.bound  # the layout's bound is this plan's
        else:
            lb = step_time_lower_bound(self.model, self.cluster, plan)
        return self._rules_out(layout, lb, wanted)

    def _rules_out(self, layout: _Layout, lb: float, wanted) -> bool:
        if wanted is None:
            return layout.rankable and lb >= self.kth_best()
        return all(lb >= self.best_by_knob.get(kv, float("inf")) for kv in wanted)

    def _record(self, est: Estimate, rankable: bool) -> None:
        self.fitting.append(est)
        t = est.step_time_s
        for kv in ((k, getattr(est.plan, k)) for k in EXPLAINED_KNOBS):
            if t < self.best_by_knob.get(kv, float("inf")):
                self.best_by_knob[kv] = t
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
    usable = dev.usable_gib * (1 - space.memory_headroom)
    if space.max_memory_gib:
        usable = min(usable, space.max_memory_gib)
    invalid: list[str] = []
    layouts = _layouts(model, cluster, global_batch, seq_len, space, cross_node_tp, invalid)
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
            for kv in {kv for lay in layouts for kv in lay.knob_values}:
                values[kv[0]].add(kv[1])
            for knob in EXPLAINED_KNOBS:
                alternatives[knob] = nearest_values(knob, getattr(best.plan, knob), values[knob])
            targets = {(k, v) for k, vs in alternatives.items() for v in vs}
            for layout in layouts:
                if layout.done:
                    continue
                if layout.bound >= max(search.best_by_knob.get(kv, float("inf")) for kv in targets):
                    break  # sorted by bound: no later layout can improve any alternative
                wanted = [kv for kv in layout.knob_values
                          if kv in targets and search.bound_for(layout, kv) < search.best_by_knob.get(kv, float("inf"))]
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
