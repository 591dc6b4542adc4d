"""Measured vs predicted data-parallel gradient bytes per step (``partita profile``, issue 17).

Measured: what each rank's :class:`partita.profile.collective_counter.CollectiveCounter` saw on its
data-parallel group, per step, by collective (``rank<N>.summary.json``'s ``dp_wire``).
Predicted: :func:`partita.cost.memory.dp_gradient_bytes`' ``wire`` - the reduction buffer
the plan's knobs send (fp32, bf16: half, PowerSGD: the rank-1 tensors plus P and Q) - times
the reductions per step (one; one per micro-batch with zero 2/3's sharded accumulation).
The gradient collectives compared are all-reduce and reduce-scatter; the parameter
all-gathers of zero 3 and the one-element loss all-reduce per micro-batch are reported but
are not gradient traffic (the loss adds 4 bytes per micro-batch to the all-reduce figure).
No torch here: the planning side can read a recorded report.
"""
from __future__ import annotations

import statistics

GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter")


def reductions_per_step(plan) -> int:
    """Gradient reductions per optimizer step: one, or one per micro-batch where zero 2/3
    reduce-scatter each micro-batch's gradients (sharded accumulation)."""
    sharded = plan.zero >= 2 and plan.grad_accum > 1 and plan.grad_accum_mode == "sharded"
    return plan.grad_accum if sharded else 1


def knob_name(plan) -> str:
    """fp32 / bf16 / powersgd-r<rank>: the gradient knob a report row is about."""
    if plan.grad_compression == "powersgd":
        return f"powersgd-r{plan.powersgd_rank}"
    return "bf16" if plan.grad_dtype == "bf16" and plan.dtype != "fp32" else "fp32"


def compare_dp_bytes(summaries: list[dict], plan, model) -> dict:
    """The report's ``dp_bytes`` section: measured per collective (mean over ranks), the
    predicted gradient bytes and measured/predicted; {} without data parallelism."""
    from ..cost.memory import dp_gradient_bytes
    wires = [s.get("dp_wire") or {} for s in summaries]
    wires = [w for w in wires if w.get("by_collective")]
    if not wires:
        return {}
    kinds = sorted({k for w in wires for k in w["by_collective"]})
    measured = {k: {f: statistics.mean(w["by_collective"].get(k, {}).get(f, 0.0) for w in wires)
                    for f in ("bytes", "calls", "seconds")} for k in kinds}
    gradient = sum(measured[k]["bytes"] for k in GRADIENT_COLLECTIVES if k in measured)
    predicted = dp_gradient_bytes(model, plan)
    per_step = predicted["wire"] * reductions_per_step(plan)
    return {"knob": knob_name(plan), "first_step": wires[0].get("first_step"), "group": wires[0].get("group"),
            "steps": max(int(e.get("steps", 0)) for w in wires for e in w["by_collective"].values()),
            "measured_by_collective": measured, "measured_gradient_bytes": gradient,
            "predicted_gradient_bytes": per_step, "predicted_fp32_bytes": predicted["held"] * reductions_per_step(plan),
            "ratio_measured_over_predicted": gradient / per_step if per_step else None}


def dp_bytes_lines(section: dict) -> list[str]:
    """The report's lines for the data-parallel bytes (empty without data parallelism)."""
    if not section:
        return []
    lines = [f"data-parallel bytes per step ({section['knob']}, group {section['group']}, mean of steps "
             f">= {section['first_step']}, counted at each collective call):"]
    for kind, m in section["measured_by_collective"].items():
        lines.append(f"  {kind:<15} {m['bytes']:>14,.0f} B  {m['calls']:5.1f} calls  {m['seconds'] * 1e3:8.2f} ms")
    ratio = section["ratio_measured_over_predicted"]
    lines.append(f"  gradient bytes measured {section['measured_gradient_bytes']:,.0f} vs predicted "
                 f"{section['predicted_gradient_bytes']:,.0f} (ratio {ratio:.4f}; uncompressed fp32 "
                 f"{section['predicted_fp32_bytes']:,.0f})" if ratio is not None else
                 f"  gradient bytes measured {section['measured_gradient_bytes']:,.0f}, predicted 0")
    return lines
