"""DeepSpeed ``ds_config`` JSON for a plan.

Keys as DeepSpeed 0.19 defines them (runtime/constants.py, runtime/zero/config.py,
runtime/activation_checkpointing/config.py; shared/reference/ecosystem.md sec. 6).
DeepSpeed silently accepts unknown top-level keys, so :data:`TOP_LEVEL_KEYS` is checked
here. DeepSpeed has no tensor parallel for arbitrary models in this config and no
explicit layer-to-stage list: such plans are refused (exit 2) rather than half-exported.
"""
from __future__ import annotations

import json

from ..errors import PartitaError
from ..plan import Plan
from . import Export

TOP_LEVEL_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "gradient_clipping", "bf16", "fp16", "zero_optimization", "activation_checkpointing",
                  "steps_per_print", "wall_clock_breakdown", "pipeline", "sequence_parallel_size"}


def ds_config(plan: Plan) -> tuple[dict, list[str]]:
    warn: list[str] = []
    if plan.tp > 1:
        raise PartitaError(f"tp={plan.tp}: a ds_config cannot express Megatron-style tensor parallelism; "
                           "export to megatron, or re-plan with --tp 1")
    if plan.layer_split and len(set(plan.layer_split)) > 1:
        raise PartitaError("an uneven layer split cannot be expressed in DeepSpeed's PipelineModule "
                           "(no explicit boundary list); re-plan with an even split or export to megatron")
    if plan.vpp > 1:
        raise PartitaError("vpp > 1: DeepSpeed pipelines have no interleaved schedule; re-plan with --vpp 1")
    if plan.ep > 1:
        raise PartitaError("ep > 1: expert parallelism lives in DeepSpeed-MoE layer code, not in ds_config; "
                           "export to megatron or torchtitan")
    if plan.cp > 1:
        raise PartitaError("cp > 1: ring context parallelism is not a ds_config option (Ulysses is a different "
                           "algorithm); export to megatron or torchtitan")
    cfg: dict = {
        "train_batch_size": plan.gbs,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": plan.zero, "overlap_comm": bool(plan.overlap_grad_reduce),
                              "contiguous_gradients": True},
        "steps_per_print": 10,
    }
    if plan.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif plan.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 1000}
    elif plan.dtype == "fp8":
        cfg["bf16"] = {"enabled": True}
        warn.append("dtype=fp8: ds_config has no fp8 GEMM switch (use Transformer Engine layers); emitted bf16")
    if plan.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
        warn.append(f"recompute={plan.recompute}: DeepSpeed checkpoints what the model code wraps with "
                    "deepspeed.checkpointing.checkpoint; wrap every block"
                    + (" (whole-block, i.e. full recompute; no op-level selective policy)" if plan.recompute == "selective" else ""))
    if plan.pp > 1:
        cfg["pipeline"] = {"stages": plan.pp, "partition": "uniform"}
        if plan.schedule != "1f1b":
            warn.append(f"schedule={plan.schedule}: DeepSpeed pipelines run 1F1B; emitted 1F1B")
    unknown = set(cfg) - TOP_LEVEL_KEYS
    assert not unknown, unknown
    return cfg, warn


def export_deepspeed(plan: Plan, model=None) -> Export:
    cfg, warn = ds_config(plan)
    return Export("deepspeed", json.dumps(cfg, indent=2) + "\n", warn, cfg)
