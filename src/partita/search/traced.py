"""Search plans for a traced model (:class:`~partita.spec.traced.TracedSpec`).

The space is what a traced model supports (:func:`partita.cost.traced.traced_problems`):
data parallel with ZeRO 0-3, recompute none or full per block, tensor parallel inside a
node where the trace has a TP plan, pipeline stages over the repeated blocks where they
form one sequence, and the micro-batch size. Every candidate is estimated
(:func:`partita.estimate.estimate`, which routes traced specs to :mod:`partita.cost.traced`);
those that fit the memory limit are ranked by step time. "Why not" lines change one knob
of the best plan at a time and say what breaks: memory, speed, or a constraint.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..cost.memory import memory_limit_gib
from ..cost.traced import traced_problems
from ..errors import PartitaError
from ..estimate import Estimate, estimate
from ..plan import Plan
from ..spec.hardware import Cluster
from ..spec.traced import TracedSpec


@dataclass
class TracedSearch:
    """Ranked plans (fitting ones, fastest first) and the why-not lines of the best."""

    model: TracedSpec
    cluster: Cluster
    plans: list[Estimate]
    evaluated: int
    memory_limit_gib: float
    search_time_s: float
    why_not: list[str] = field(default_factory=list)
    smallest: Estimate | None = None  # the least memory of all candidates (for the infeasible message)

    @property
    def best(self) -> Estimate | None:
        return self.plans[0] if self.plans else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(spec: TracedSpec, cluster: Cluster, gbs: int, dtype: str, fixed: dict) -> list[Plan]:
    """Every plan of the traced space for ``gbs`` samples on the cluster (``fixed``: knobs the user set)."""
    world = cluster.world_size
    tps = [t for t in _divisors(min(world, cluster.devices_per_node)) if t == 1 or spec.tp_capable]
    pps = [p for p in _divisors(world) if p == 1 or (spec.pipeline and p <= spec.layers)]
    out = []
    for tp in tps:
        for pp in pps:
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if gbs % dp:
                continue
            for mbs in _divisors(gbs // dp):
                for zero in (0, 1, 2, 3):
                    for recompute in ("none", "full"):
                        plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, mbs=mbs, gbs=gbs, seq_len=1,
                                    recompute=recompute, dtype=dtype)
                        if all(getattr(plan, k) == v for k, v in fixed.items() if v is not None):
                            out.append(plan)
    return out


def search_traced(spec: TracedSpec, cluster: Cluster, gbs: int, dtype: str = "bf16", headroom: float = 0.05,
                  cap_gib: float | None = None, top: int = 5, **fixed) -> TracedSearch:
    """The ``top`` fastest fitting plans for ``gbs`` samples per step, with why-not lines."""
    start = time.perf_counter()
    limit = memory_limit_gib(cluster.device, headroom, cap_gib)
    probe = Plan(**{k: v for k, v in fixed.items() if k in ("tp", "pp", "recompute") and v is not None})
    problems = [p for p in traced_problems(spec, probe) if not p.startswith(("global batch", "dp*"))]
    if problems:
        raise PartitaError(problems[0])
    plans = candidates(spec, cluster, gbs, dtype, fixed)
    if not plans:
        raise PartitaError(f"no plan of {spec.name} for {gbs} samples on {cluster.world_size} devices: the global "
                           f"batch must be a multiple of the data-parallel degree (e.g. {cluster.world_size})")
    estimates = [estimate(spec, cluster, p) for p in plans]
    for e in estimates:
        e.memory_limit = limit
    fitting = sorted((e for e in estimates if e.fits), key=lambda e: e.step_time_s)
    result = TracedSearch(spec, cluster, fitting[:top], len(estimates), limit, 0.0,
                          smallest=min(estimates, key=lambda e: e.peak_memory_gib))
    if fitting:
        result.why_not = why_not(fitting[0], cluster, limit)
    result.search_time_s = time.perf_counter() - start
    return result


def why_not(best: Estimate, cluster: Cluster, limit: float) -> list[str]:
    """One line per alternative value of each knob of the best plan."""
    plan, spec = best.plan, best.model
    lines = []
    alternatives = {"zero": [z for z in (0, 1, 2, 3) if z != plan.zero],
                    "recompute": [r for r in ("none", "full") if r != plan.recompute],
                    "tp": [plan.tp * 2] + ([plan.tp // 2] if plan.tp > 1 else []),
                    "pp": [plan.pp * 2] + ([plan.pp // 2] if plan.pp > 1 else [])}
    for knob, values in alternatives.items():
        for value in values:
            changes = {knob: value}
            if knob in ("tp", "pp"):
                other = plan.tp * plan.pp * plan.dp // (value * (plan.pp if knob == "tp" else plan.tp))
                changes["dp"] = other
                if other < 1 or other * value * (plan.pp if knob == "tp" else plan.tp) != cluster.world_size:
                    continue
            alt = plan.with_(**changes)
            problems = traced_problems(spec, alt, cluster.world_size)
            if problems:
                lines.append(f"why not {knob}={value}: {problems[0]}")
                continue
            e = estimate(spec, cluster, alt)
            e.memory_limit = limit
            if not e.fits:
                lines.append(f"why not {knob}={value}: needs {e.peak_memory_gib:.1f} GiB > {limit:.1f} GiB limit")
            else:
                lines.append(f"why not {knob}={value}: {e.step_time_s / best.step_time_s - 1:+.0%} step time "
                             f"({alt.summary()})")
    return lines
