"""Re-plan for a different number of processes, keeping the global batch.

Used when an elastic job comes back on another world size or a checkpoint is resumed
with another ``--nproc``: keep tp, pp, cp and the global batch when they still divide the
new world, shrink them otherwise, and let dp fill the rest; the micro-batch shrinks to
the largest size the new per-replica batch allows.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import PartitaError
from ..plan import Plan, validate


def replan(plan: Plan, world: int, model=None) -> Plan:
    candidates = []
    for tp in sorted({plan.tp, *[t for t in (8, 4, 2, 1) if t <= plan.tp]}, reverse=True):
        for pp in sorted({plan.pp, *[p for p in (8, 4, 2, 1) if p <= plan.pp]}, reverse=True):
            cp = plan.cp
            if world % (tp * pp * cp):
                continue
            dp = world // (tp * pp * cp)
            if plan.gbs % dp:
                continue
            per = plan.gbs // dp
            mbs = max(m for m in range(1, min(plan.mbs, per) + 1) if per % m == 0)
            ep = plan.ep if (dp * cp) % plan.ep == 0 else 1
            new = replace(plan, dp=dp, tp=tp, pp=pp, mbs=mbs, ep=ep, vpp=plan.vpp if pp > 1 else 1,
                          layer_split=None, sp=plan.sp and tp > 1,
                          schedule=plan.schedule if pp > 1 else "1f1b")
            if pp > 1 and new.grad_accum < pp:
                continue
            if not validate(new, model, world):
                candidates.append(new)
    if not candidates:
        raise PartitaError(f"no plan keeps global batch {plan.gbs} on {world} processes; pass a new --plan")
    return candidates[0]


def describe_change(old: Plan, new: Plan) -> str:
    fields = ("dp", "tp", "pp", "vpp", "cp", "ep", "mbs", "zero")
    changes = [f"{f} {getattr(old, f)}->{getattr(new, f)}" for f in fields if getattr(old, f) != getattr(new, f)]
    return ", ".join(changes) or "nothing"
