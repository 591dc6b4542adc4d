"""torchtitan settings for a plan, as torchtitan 0.3.0 spells them (tyro CLI overrides
``--section.field value``; shared/reference/ecosystem.md sec. 3.3). The field tables below
are torchtitan's ``ParallelismConfig`` / ``TrainingConfig`` names; tests check the
emitted ones against them (and against torchtitan's own dataclasses when installed)."""
from __future__ import annotations

from ..errors import PartitaError
from ..plan import Plan
from . import Export

PARALLELISM_FIELDS = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                      "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
                      "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
                      "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                      "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                      "context_parallel_degree", "context_parallel_load_balancer", "context_parallel_ptrr_mask_key",
                      "expert_parallel_degree"}
TRAINING_FIELDS = {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload",
                   "disable_cuda_graphs", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq", "gc_debug"}
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-1f1b": "Interleaved1F1B", "zero-bubble": "InterleavedZeroBubble"}


def torchtitan_settings(plan: Plan) -> tuple[dict[str, dict], str, list[str]]:
    """({section: {field: value}}, activation-checkpoint subcommand, warnings)."""
    warn: list[str] = []
    if plan.zero in (1, 2):
        warn.append(f"zero={plan.zero}: torchtitan shards with FSDP2 only; emitted FSDP without resharding after "
                    "forward (fsdp_reshard_after_forward=never, ZeRO-2-like), which needs no more memory than "
                    "the plan's ZeRO-1/2")
    par: dict = {"tensor_parallel_degree": plan.tp, "enable_sequence_parallel": bool(plan.sp),
                 "pipeline_parallel_degree": plan.pp, "context_parallel_degree": plan.cp,
                 "expert_parallel_degree": plan.ep}
    if plan.zero == 0:
        par["data_parallel_replicate_degree"] = plan.dp
        par["data_parallel_shard_degree"] = 1
    else:
        par["data_parallel_replicate_degree"] = 1
        par["data_parallel_shard_degree"] = plan.dp
        par["fsdp_reshard_after_forward"] = "always" if plan.zero == 3 else "never"
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[plan.schedule if plan.vpp > 1 or plan.schedule in ("1f1b", "gpipe")
                                                      else "1f1b"]
        par["pipeline_parallel_microbatch_size"] = plan.mbs
        if plan.layer_split:
            if len(set(plan.layer_split[1:-1])) > 1:
                raise PartitaError("torchtitan expresses uneven splits only as lighter first/last stages; this "
                                   "layer_split varies in the middle - export to megatron (pipeline layout)")
            middle = plan.layer_split[1] if len(plan.layer_split) > 2 else max(plan.layer_split)
            par["pipeline_parallel_layers_per_stage"] = middle
            par["pipeline_parallel_first_stage_less_layers"] = middle - plan.layer_split[0]
            par["pipeline_parallel_last_stage_less_layers"] = middle - plan.layer_split[-1]
        else:
            par["pipeline_parallel_first_stage_less_layers"] = 0
            par["pipeline_parallel_last_stage_less_layers"] = 0
    # torchtitan's local batch is per data-parallel rank per step; with pp the microbatch size splits it
    # local_batch_size is one rank's batch per forward; torchtitan accumulates
    # global / (local * dp) times. With pp the local batch is the whole step's share and the
    # schedule cuts it into pipeline micro-batches.
    local = plan.gbs // plan.dp if plan.pp > 1 else plan.mbs
    train: dict = {"local_batch_size": local, "global_batch_size": plan.gbs, "seq_len": plan.seq_len,
                   "max_norm": 1.0, "mixed_precision_param": "bfloat16" if plan.dtype in ("bf16", "fp8") else
                   "float16" if plan.dtype == "fp16" else "float32", "mixed_precision_reduce": "float32"}
    if plan.pp > 1:
        train["disable_cuda_graphs"] = True
    if plan.dtype == "fp8":
        warn.append("dtype=fp8: enable torchtitan's float8 converter (--model.converters float8); "
                    "not a parallelism/training field")
    if plan.dtype == "fp16":
        warn.append("dtype=fp16: torchtitan trains bf16/fp32; fp16 parameters without a loss scaler are unsafe")
    ac = {"none": "none", "selective": "selective", "full": "full"}[plan.recompute]
    for section, fields, allowed in (("parallelism", par, PARALLELISM_FIELDS), ("training", train, TRAINING_FIELDS)):
        bad = set(fields) - allowed
        assert not bad, (section, bad)
    return {"parallelism": par, "training": train}, ac, warn


def export_torchtitan(plan: Plan, model=None) -> Export:
    sections, ac, warn = torchtitan_settings(plan)
    lines = ["# partita export --to torchtitan: overrides for torchtitan 0.3.0's trainer",
             "# (python -m torchtitan.train --module <your model module> --config <your config> <these flags>)"]
    lines += [f"# WARNING: {w}" for w in warn]
    flags = []
    for section, fields in sections.items():
        for key, value in fields.items():
            if isinstance(value, bool):
                value = str(value)
            flags.append(f"--{section}.{key} {value}")
    flags.append(f"activation_checkpoint:{ac}")
    lines.append(" \\\n".join(flags))
    return Export("torchtitan", "\n".join(lines) + "\n", warn, {"sections": sections, "activation_checkpoint": ac})
