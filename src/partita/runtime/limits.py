"""This runtime's limits on top of :func:`partita.plan.validate`: the plans it refuses, one
line each saying what to run instead. Its own module so that ``--plan auto``
(:mod:`.auto`) can skip refused plans without importing :mod:`.parallelize` (which
imports :mod:`.auto` for ``parallelize(model, "auto")``)."""
from __future__ import annotations

from torch import nn

from ..errors import PartitaError
from ..models.registry import family_of
from ..plan import Plan


def etp_refusal(plan: Plan) -> str:
    """Why this runtime cannot run ``plan.etp > 1`` (what is missing, what to run instead)."""
    return (f"etp={plan.etp}: expert tensor parallel is not implemented by this runtime (no etp mesh axis, no "
            "column/row split of the experts, no token all-gather/reduce-scatter around them); it is planned and "
            "exported to Megatron/MindSpeed only - run etp=1")


def runtime_check(plan: Plan, model: nn.Module) -> None:
    """Constraints of this runtime on top of :func:`partita.plan.validate` (one line each)."""
    errs = []
    if plan.dtype == "fp8":
        errs.append("fp8 training is not implemented by the runtime yet (plan and estimate it; run bf16)")
    if family_of(model).name == "hf":  # dense HF models run every layout; HF MoE models these two apart:
        if plan.ep > 1 and plan.zero >= 2:  # FSDP does not keep their fused experts apart (sharded over edp) yet
            errs.append("HF MoE models (Mixtral, Qwen-MoE) run ep with zero 0/1 in this runtime; run zero<=1 with "
                        "ep, or zero 2/3 with ep=1")
        if plan.tp > 1 and plan.sp and "MoeBlock" in " ".join(type(m).__name__ for m in model.modules()):
            errs.append("HF MoE models run tp without sequence parallel in this runtime; pass sp=false")
    if 0 < plan.dp_shard < plan.dp and (plan.cp > 1 or plan.ep > 1):
        errs.append("HSDP (dp_shard < dp) runs with cp = 1 and ep = 1 in this runtime")
    if 0 < plan.dp_shard < plan.dp and plan.zero < 2:  # zero 1 HSDP: plan.py allows it (Megatron, InternLM)
        errs.append("HSDP (dp_shard < dp) runs with zero 2/3 in this runtime (zero 1 with dp_shard is planned only)")
    if plan.ep > 1 and (plan.dp * plan.cp) % plan.ep:  # plan.ep_folded
        errs.append(f"ep={plan.ep} must divide dp*cp = {plan.dp * plan.cp} in this runtime (ep folded into tp is "
                    "planned and exported to Megatron only)")
    if plan.etp > 1:
        errs.append(etp_refusal(plan))
    from .lora import lora_problem
    if lora_problem(plan, model):
        errs.append(lora_problem(plan, model))
    if plan.pp > 1 and plan.dp > 1 and plan.zero >= 2 and plan.schedule == "zero-bubble" \
            and plan.grad_accum_mode == "sharded":
        errs.append("schedule zero-bubble with zero 2/3 accumulates gradients unsharded (torch's split backward); "
                    "pass grad_accum_mode=unsharded")
    if plan.dtype == "fp16" and plan.zero >= 1 and plan.dp > 1:
        errs.append("fp16 with loss scaling runs with zero 0 in this runtime (use bf16 with sharded optimizers/FSDP)")
    if errs:
        raise PartitaError("plan not runnable: " + "; ".join(errs))
