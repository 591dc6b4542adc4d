"""Enumerate, prune by memory, rank by predicted step time.

For every structural layout (tp, pp, vpp, cp, ep, mbs) the memory-saving knobs are
walked in order of cost - recompute none -> selective -> full, zero 1 -> 2, and zero 3
separately when allowed - and the first setting that fits is kept (each later setting
only adds time in the cost model, so nothing faster is skipped). Every evaluation is
counted in ``candidates_evaluated``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..cost.compute import layer_forward, output_forward
from ..cost.memory import GIB, peak_memory_ladder
import heapq

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
    candidates_bounded: int = 0  # fitting plans whose time bound could not beat the best found
    invalid: list[str] = field(default_factory=list)

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


def _split(model: ModelSpec, cluster: Cluster, plan: Plan) -> tuple[int, ...] | None:
    """Layer split: even when possible, else the exact min-max split (v=1) or the
    embedding-aware balanced split (v>1)."""
    chunks = plan.pp * plan.vpp
    if chunks == 1:
        return None
    if plan.vpp > 1:
        if model.layers % chunks == 0:
            return None
        return balanced_split(model.layers, chunks)
    layer = layer_forward(model, cluster.device, plan, bool(model.moe) and model.moe_flags[-1]).time
    out = output_forward(model, cluster.device, plan).time
    split = best_split(model.layers, chunks, 0.0, round(out / layer, 2) if layer else 0.0)
    if split and model.layers % chunks == 0 and max(split) >= model.layers // chunks:
        return None  # even split is as good
    return split or None


def search_plans(model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int,
                 space: SearchSpace | None = None, top: int = 5, cross_node_tp: bool = True) -> SearchResult:
    """Search the whole plan space for ``model`` on ``cluster``; best plans first."""
    space = space or SearchSpace()
    t0 = time.perf_counter()
    dev = cluster.device
    if not dev.supports(space.dtype):
        dev.peak_flops(space.dtype)  # raises the one-line error
    usable = dev.usable_gib * (1 - space.memory_headroom)
    if space.max_memory_gib:
        usable = min(usable, space.max_memory_gib)
    attempts: list[Attempt] = []
    fitting: list[Estimate] = []
    evaluated = 0
    pruned = 0
    invalid: list[str] = []
    # Memory dominance, all else equal: it grows with mbs, shrinks with ep (> 1), and
    # shrinks with pp (> 1) at vpp = 1 - per-rank weights fall as 1/pp while the first
    # stage's in-flight activations stay ~constant (min(m, p) micro-batches of L/p layers,
    # m scaling with p at fixed devices), and interleaving only adds activations. Once
    # the leanest setting of a layout fails, every layout it dominates fails too.
    failed: dict[tuple, list[tuple[int, int, int, int]]] = {}
    # Bounding: a fitting plan whose compute-only lower bound is no better than the
    # top-K so far and than the best plan found for each of its knob values cannot change
    # the ranking or any "why not" line, so its full estimate is skipped.
    best_by_knob: dict[tuple[str, object], float] = {}
    top_heap: list[float] = []  # negated step times of the best `top` rankable plans
    bounded = 0
    for tp, cp, pp, dp, ep, mbs, vpp in _structures(model, cluster, global_batch, seq_len, space, cross_node_tp):
        doomed_key = (tp, cp)
        if any(mbs_f <= mbs and ep_f >= ep and (ep > 1 or ep_f == 1)
               and ((pp_f == pp and vpp_f == vpp) or (vpp_f == 1 and pp_f >= pp > 1))
               for pp_f, vpp_f, ep_f, mbs_f in failed.get(doomed_key, ())):
            pruned += 1
            continue
        base = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=tp > 1, zero=1 if dp * cp > 1 else 0,
                    mbs=mbs, gbs=global_batch, seq_len=seq_len, dtype=space.dtype,
                    schedule="interleaved-1f1b" if vpp > 1 else "1f1b", **space.options)
        split = _split(model, cluster, base)
        if split is not None:
            base = base.with_(layer_split=split)
        errs = validate(base, model, cluster.world_size)
        if errs:
            invalid.append(f"{base.summary()}: {errs[0]}")
            continue
        allow_z3 = space.allow_zero3 and dp * cp > 1
        ladder = [step for step in LADDER + (LADDER_Z3 if allow_z3 else [])
                  if (not space.recompute or step[0] == space.recompute)
                  and (space.allow_recompute or step[0] == "none")]
        ladder = [(rc, 0 if dp * cp == 1 and z < 3 else z) for rc, z in ladder]
        ladder = [step for step in dict.fromkeys(ladder) if space.zero is None or step[1] == space.zero]
        if not ladder:
            continue
        if top and len(top_heap) >= top:
            # no setting of this layout can be faster than its compute with no recompute
            lb = step_time_lower_bound(model, cluster, base.with_(recompute="none"))
            rankable = bool(space.tp) or tp <= cluster.devices_per_node
            values = [(k, getattr(base, k)) for k in EXPLAINED_KNOBS if k not in ("recompute", "zero")]
            values += [("recompute", rc) for rc, _ in ladder] + [("zero", z) for _, z in ladder]
            if (not rankable or lb >= -top_heap[0]) and all(lb >= best_by_knob.get(kv, float("inf")) for kv in values):
                bounded += 1
                continue
        # the setting with the least memory first: if even that does not fit, no setting does
        leanest = max(ladder, key=lambda st: (st[1], RECOMPUTE_ORDER[st[0]]))
        peaks = peak_memory_ladder(model, dev, base, ladder)  # all settings at once: they share the work
        evaluated += 1
        peak_bytes, peak_rank = peaks[leanest]
        if peak_bytes / GIB > usable:
            attempts.append(Attempt(plan=base.with_(recompute=leanest[0], zero=leanest[1]),
                                    peak_gib=peak_bytes / GIB, peak_rank=peak_rank))
            failed.setdefault(doomed_key, []).append((pp, vpp, ep, mbs))
            continue
        # walk each ladder (zero <= 2, then zero 3) in order of cost; keep the first fit of each.
        # ZeRO-3 only adds communication to the same compute, so it is only worth trying
        # with a lighter recompute than the zero <= 2 ladder needed.
        heaviest = 3
        for group in ([st for st in ladder if st[1] < 3], [st for st in ladder if st[1] == 3]):
            for recompute, zero in group:
                weight = RECOMPUTE_ORDER[recompute]
                if zero == 3 and weight >= heaviest:
                    break
                plan = base.with_(recompute=recompute, zero=zero)
                if (recompute, zero) != leanest:
                    evaluated += 1
                pb, pr = peaks[(recompute, zero)]
                attempt = Attempt(plan=plan, peak_gib=pb / GIB, peak_rank=pr)
                attempts.append(attempt)
                if attempt.peak_gib <= usable:
                    if zero < 3:
                        heaviest = weight
                    rankable = bool(space.tp) or tp <= cluster.devices_per_node
                    knobs = [(k, getattr(plan, k)) for k in EXPLAINED_KNOBS]
                    if top and len(top_heap) >= top:
                        lb = step_time_lower_bound(model, cluster, plan)
                        if (not rankable or lb >= -top_heap[0]) and all(lb >= best_by_knob.get(kv, float("inf")) for kv in knobs):
                            attempt.bounded = True
                            bounded += 1
                            break
                    est = Estimate(model=model, cluster=cluster, plan=plan, time=estimate_step_time(model, cluster, plan))
                    attempt.estimate = est
                    fitting.append(est)
                    t = est.step_time_s
                    for kv in knobs:
                        if t < best_by_knob.get(kv, float("inf")):
                            best_by_knob[kv] = t
                    if rankable and top:
                        if len(top_heap) < top:
                            heapq.heappush(top_heap, -t)
                        elif t < -top_heap[0]:
                            heapq.heapreplace(top_heap, -t)
                    break
    fitting.sort(key=lambda e: e.step_time_s)
    # keep tp groups inside a node for the ranking unless the user fixed tp; cross-node
    # candidates stay in `attempts` for the explanations
    ranked = [e for e in fitting if space.tp or e.plan.tp <= cluster.devices_per_node]
    return SearchResult(model=model, cluster=cluster, plans=ranked[:top] if top else ranked, attempts=attempts,
                        candidates_evaluated=evaluated, candidates_pruned=pruned, candidates_bounded=bounded,
                        search_time_s=time.perf_counter() - t0,
                        memory_limit_gib=usable, invalid=invalid)


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
