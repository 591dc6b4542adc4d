"""A brute-force plan search written independently of ``partita.search``: the oracle the
engine's branch and bound is checked against (tests/test_search.py).

It shares nothing with the engine but the public pieces both are defined by: the plan
constraints (:func:`partita.plan.validate`, the one home of constraints) and the
estimator (:func:`partita.estimate.estimate`). It enumerates every plan of the space the
engine documents (``partita/search/space.py``) - and more: sequence parallelism off as
well as on, ZeRO 0 as well as 1/2/3, and every contiguous layer split rather than the
engine's even / min-max one - estimates each, keeps the ones whose peak fits the
memory limit, and sorts them by step time. No bound, no pruning, no ladder: if the
engine's pruning or its "dominated" claims (sp on, ZeRO 1 over 0, the min-max split)
were wrong, this finds a faster plan.

The space, as ``space.py`` states it for the ranked plans:

* tp divides the world and stays inside a node (tp <= devices per node);
* cp is 1, or any divisor leaving each rank >= ``MIN_TOKENS_PER_CP_RANK`` tokens;
* pp divides the rest, at most the layer count; dp fills what is left;
* ep divides tp*dp*cp and the expert count (MoE only): carved out of dp*cp, or folded
  into tp (Megatron-Core's MoE parallel folding, expert tensor parallel 1);
* mbs divides the per-replica batch with ``mbs * seq <= MAX_TOKENS_PER_MICROBATCH`` (or is 1);
* vpp from 1 to ``MAX_VPP`` when pp > 1; with vpp 2 the DualPipeV schedule as well as interleaved 1F1B;
* zero 0..3 (3 only with data or context parallelism); recompute none/selective/full;
* with full recompute, ``recompute_layers`` N from 1 to the largest stage/chunk (only the
  first N layers of each chunk recomputed, Megatron's ``--recompute-method block
  --recompute-num-layers N``) as well as 0 (every layer): every N, not the one the
  engine solves for (``SearchSpace.partial_recompute``);
* the memory limit: the device's usable memory (no headroom by default); the engine runs
  with ``risk=False`` against it (its risk-aware ranking is tested in tests/test_intervals.py).

Only small models (a few layers) on a few devices: the layer splits are enumerated
exhaustively (``C(L+1, chunks-1)`` of them).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from partita.estimate import Estimate, estimate
from partita.plan import Plan, validate
from partita.spec.hardware import Cluster
from partita.spec.model import ModelSpec

MIN_TOKENS_PER_CP_RANK = 2048
MAX_TOKENS_PER_MICROBATCH = 131072
MAX_VPP = 32
HEADROOM = 0.0  # SearchSpace.memory_headroom's default (partita.uncertainty.DEFAULT_HEADROOM)
RECOMPUTE = ("none", "selective", "full")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layer_splits(layers: int, chunks: int) -> list[tuple[int, ...] | None]:
    """Every contiguous split validation accepts: middle chunks >= 1 layer, the first
    and last (embedding, loss) >= 0. ``None`` stands for the even split."""
    if chunks == 1:
        return [None]
    out: list[tuple[int, ...] | None] = [None] if layers % chunks == 0 else []
    even = (layers // chunks,) * chunks
    # stars and bars over layers + 2 (the two ends may be empty): cut points in 1..layers+1
    for cuts in itertools.combinations(range(1, layers + 2), chunks - 1):
        bounds = (0,) + cuts + (layers + 2,)
        parts = [bounds[i + 1] - bounds[i] for i in range(chunks)]
        parts[0] -= 1
        parts[-1] -= 1
        if min(parts) >= 0 and tuple(parts) != even:
            out.append(tuple(parts))
    return out


def structures(model: ModelSpec, cluster: Cluster, gbs: int, seq: int):
    """(tp, cp, pp, dp, ep, mbs, vpp) of every layout, before validation."""
    n = cluster.world_size
    for tp in (t for t in _divisors(n) if t <= cluster.devices_per_node):
        for cp in (c for c in _divisors(n // tp) if c == 1 or seq // c >= MIN_TOKENS_PER_CP_RANK):
            for pp in (p for p in _divisors(n // (tp * cp)) if p <= model.layers):
                dp = n // (tp * cp * pp)
                if gbs % dp:
                    continue
                eps = [e for e in _divisors(tp * dp * cp) if model.moe.num_experts % e == 0] if model.moe else [1]
                for ep in eps:
                    for mbs in (b for b in _divisors(gbs // dp) if b == 1 or b * seq <= MAX_TOKENS_PER_MICROBATCH):
                        for vpp in (range(1, MAX_VPP + 1) if pp > 1 else (1,)):
                            yield tp, cp, pp, dp, ep, mbs, vpp


def recompute_settings(model: ModelSpec, chunks: int, split: tuple[int, ...] | None,
                       partial: bool) -> list[tuple[str, int]]:
    """(recompute, recompute_layers) of a layer split: none, selective, full of every
    layer (0), and - with ``partial`` - full of the first N layers of each chunk for every
    N from 1 to the largest chunk (the even split's chunk is ``layers / chunks``)."""
    out = [(mode, 0) for mode in RECOMPUTE]
    if partial:
        largest = max(split) if split else model.layers // chunks
        out += [("full", n) for n in range(1, largest + 1)]
    return out


def plans(model: ModelSpec, cluster: Cluster, gbs: int, seq: int, dtype: str = "bf16", partial: bool = True,
          **options):
    """Every valid plan of the space (see the module docstring); ``partial`` adds the
    full-recompute plans of every ``recompute_layers``."""
    for tp, cp, pp, dp, ep, mbs, vpp in structures(model, cluster, gbs, seq):
        if pp * vpp > model.layers + 2:
            continue
        for split in layer_splits(model.layers, pp * vpp):
            schedules = ("interleaved-1f1b", "dualpipev") if vpp == 2 else ("interleaved-1f1b" if vpp > 1 else "1f1b",)
            for sp, zero, (recompute, n), schedule in itertools.product(
                    sorted({False, tp > 1}), (0, 1, 2, 3), recompute_settings(model, pp * vpp, split, partial),
                    schedules):
                if zero == 3 and dp * cp == 1:
                    continue
                plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp, zero=zero, mbs=mbs, gbs=gbs,
                            seq_len=seq, recompute=recompute, recompute_layers=n, dtype=dtype, layer_split=split,
                            schedule=schedule, **options)
                if not validate(plan, model, cluster.world_size):
                    yield plan


@dataclass
class BruteForce:
    """Every fitting plan's estimate, fastest first, and the limit they fit in."""

    fitting: list[Estimate]
    limit_gib: float
    enumerated: int

    def per_layout_best(self) -> list[Estimate]:
        """The fastest plan of each structural layout (tp, cp, pp, dp, ep, mbs, vpp, schedule),
        fastest first: what a top-K list of distinct layouts must match."""
        seen: set[tuple] = set()
        out = []
        for est in self.fitting:
            p = est.plan
            key = (p.tp, p.cp, p.pp, p.dp, p.ep, p.mbs, p.vpp, p.schedule)
            if key not in seen:
                seen.add(key)
                out.append(est)
        return out


def brute_force(model: ModelSpec, cluster: Cluster, gbs: int, seq: int, dtype: str = "bf16",
                partial: bool = True, **options) -> BruteForce:
    """Estimate every plan (``partial``: with every full-recompute ``recompute_layers``),
    keep those that fit, fastest first."""
    limit = cluster.device.usable_gib * (1 - HEADROOM)
    fitting, enumerated = [], 0
    for plan in plans(model, cluster, gbs, seq, dtype, partial, **options):
        enumerated += 1
        est = estimate(model, cluster, plan)
        if est.peak_memory_gib <= limit:
            fitting.append(est)
    fitting.sort(key=lambda e: e.step_time_s)
    return BruteForce(fitting=fitting, limit_gib=limit, enumerated=enumerated)
