"""The search space enumerated: every structural layout (tp, cp, pp, dp, ep, mbs, vpp and
its layer split) with its ladder of memory-saving settings and the lower bound of the
step time of any plan it can produce. The rules that shape the space are stated in
:mod:`.space`; :mod:`.engine` searches it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..cost.compute import layer_forward, output_forward
from ..cost.shape import layer_shape
from ..cost.step import step_time_lower_bound
from ..plan import Plan, balanced_split, validate
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from .space import SearchSpace, best_split, divisors, powers_of_two

#: memory-saving settings (recompute, zero) in order of cost: ZeRO <= 2, then ZeRO-3
LADDER = [("none", 1), ("none", 2), ("selective", 1), ("selective", 2), ("full", 1), ("full", 2)]
LADDER_Z3 = [("none", 3), ("selective", 3), ("full", 3)]
RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
EXPLAINED_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "mbs", "recompute", "zero")
LADDER_KNOBS = ("recompute", "zero")  # the memory-saving knobs walked per layout, in ladder-step order


def structures(model: ModelSpec, cluster: Cluster, gbs: int, seq: int, space: SearchSpace, cross_node_tp: bool):
    """Every (tp, cp, pp, dp, ep, mbs, vpp) the rules of :mod:`.space` allow, in an order
    that helps memory dominance (deepest pipeline and largest ep first)."""
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
    shape = layer_shape(plan)
    layer = layer_forward(model, cluster.device, shape, bool(model.moe) and model.moe_flags[-1]).time
    out = output_forward(model, cluster.device, shape).time
    return round(out / layer, 2) if layer else 0.0


@lru_cache(maxsize=65536)
def _min_max_split(layers: int, chunks: int, last_extra: float) -> tuple[int, ...] | None:
    split = best_split(layers, chunks, 0.0, last_extra)
    if split and layers % chunks == 0 and max(split) >= layers // chunks:
        return None  # even split is as good
    return split or None


@dataclass
class Layout:
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


def layouts_by_bound(model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, space: SearchSpace,
             cross_node_tp: bool, invalid: list[str]) -> list[Layout]:
    """Every valid layout, cheapest lower bound first (the search's hot loop: thousands
    of layouts, so what depends on few fields is computed once per value)."""
    layouts = []
    ladders = {replicated: _ladder(space, 2 if replicated else 1, 1) for replicated in (False, True)}
    ladder_values = {replicated: tuple([("recompute", rc) for rc in dict.fromkeys(rc for rc, _ in ladder)]
                                       + [("zero", z) for z in dict.fromkeys(z for _, z in ladder)])
                     for replicated, ladder in ladders.items()}
    output_ratio: dict[tuple, float] = {}  # depends on the layer shape only
    for tp, cp, pp, dp, ep, mbs, vpp in structures(model, cluster, global_batch, seq_len, space, cross_node_tp):
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
        layouts.append(Layout(base, ladder, bound, bool(space.tp) or tp <= cluster.devices_per_node, knobs))
    layouts.sort(key=lambda lay: lay.bound)  # stable: ties keep the enumeration order
    return layouts
