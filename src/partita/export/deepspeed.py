"""DeepSpeed ``ds_config`` JSON for a plan.

Keys as DeepSpeed 0.19 defines them (runtime/constants.py, runtime/zero/config.py,
runtime/activation_checkpointing/config.py, runtime/tensor_parallel/config.py ``autotp_size``;
docs/reference/ecosystem.md sec. 6). DeepSpeed silently accepts unknown top-level keys, so
:data:`TOP_LEVEL_KEYS` is checked here. What a ds_config cannot hold is refused (exit 2) rather
than half-exported:

* ZeRO-2/3 with pp > 1: ``PipelineEngine`` asserts "ZeRO-2 and ZeRO-3 are incompatible with
  pipeline parallelism" (runtime/pipe/engine.py).
* the pipeline degree is read from ``PipelineModule(num_stages=...)`` in the model code; the
  ``pipeline.stages`` key is informational only (a warning says so).
* tensor parallelism is DeepSpeed's AutoTP training (``tensor_parallel.autotp_size``), which
  shards HF-style linear layers automatically (not Megatron's hand-written layers).
"""
from __future__ import annotations

import json

from ..errors import PartitaError
from ..plan import Plan
from .context import ExportContext
from .result import Export

TOP_LEVEL_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "gradient_clipping", "bf16", "fp16", "zero_optimization", "activation_checkpointing",
                  "steps_per_print", "wall_clock_breakdown", "pipeline", "sequence_parallel_size", "tensor_parallel",
                  "communication_data_type"}


def _check_expressible(plan: Plan) -> None:
    if plan.layer_split and len(set(plan.layer_split)) > 1:
        raise PartitaError("an uneven layer split cannot be expressed in DeepSpeed's PipelineModule "
                           "(no explicit boundary list); re-plan with an even split or export to megatron")
    if plan.schedule == "dualpipev":
        raise PartitaError("schedule=dualpipev: DeepSpeed pipelines run 1F1B only (no DualPipeV, no vpp > 1; "
                           "deepspeed/runtime/pipe/schedule.py TrainSchedule); re-plan with --schedule 1f1b --vpp 1, "
                           "or export --to torchtitan or mindspeed")
    if plan.vpp > 1:
        raise PartitaError("vpp > 1: DeepSpeed pipelines have no interleaved schedule; re-plan with --vpp 1")
    if plan.ep > 1:
        raise PartitaError("ep > 1: expert parallelism lives in DeepSpeed-MoE layer code, not in ds_config; "
                           "export to megatron or torchtitan")
    if plan.cp > 1:
        raise PartitaError("cp > 1: ring context parallelism is not a ds_config option (Ulysses is a different "
                           "algorithm); export to megatron or torchtitan")
    if plan.pp > 1 and plan.zero >= 2:
        raise PartitaError(f"zero={plan.zero} with pp={plan.pp}: DeepSpeed's pipeline engine asserts ZeRO-2 and "
                           "ZeRO-3 are incompatible with pipeline parallelism; re-plan with --zero 1 or --pp 1")


def _comm_knobs(plan: Plan, cfg: dict, warn: list[str]) -> None:
    """Issue 17's knobs: grad_dtype bf16 -> communication_data_type; ddp_bucket_mb ->
    zero_optimization.reduce_bucket_size (elements); PowerSGD and FSDP prefetch depth have
    no ds_config option (warnings)."""
    if plan.grad_dtype == "bf16" and plan.dtype != "fp32":
        cfg["communication_data_type"] = "bf16"
    if plan.ddp_bucket_mb:
        cfg["zero_optimization"]["reduce_bucket_size"] = plan.ddp_bucket_mb * 2**20 // (2 if plan.grad_dtype == "bf16" else 4)
    if plan.grad_compression == "powersgd":
        warn.append(f"grad_compression=powersgd (rank {plan.powersgd_rank}): ds_config has no PowerSGD option "
                    "(its compressed optimizers, 1-bit Adam / 0/1 Adam, are other algorithms); emitted uncompressed")
    if plan.fsdp_prefetch != 1 and plan.zero == 3:
        warn.append(f"fsdp_prefetch={plan.fsdp_prefetch}: ZeRO-3 prefetches by bytes "
                    "(stage3_prefetch_bucket_size), not blocks; emitted its default")


def _optimizer_states(plan: Plan, cfg: dict, warn: list[str]) -> None:
    """``plan.optimizer_offload`` as ZeRO-Offload (``zero_optimization.offload_optimizer``, device
    cpu: the fp32 master and Adam moments in pinned host memory, stepped by DeepSpeedCPUAdam;
    runtime/zero/offload_config.py ``DeepSpeedZeroOffloadOptimizerConfig``, "valid with stage 1,
    2, and 3"). DeepSpeed offloads all of it; a fraction is its ``ratio`` ("percentage of
    offloaded optimizer states to CPU Adam. Only valid with ZeRO Stage 3", ZeRO-Offload++), so a
    fraction below 1 at zero 1-2 is refused. ``plan.moment_dtype``: ds_config keeps Adam's
    moments in bf16 only with the master weights and gradients in bf16 too
    (``bf16.bf16_optimizer_states`` needs ``bf16_master_weights_and_grads``,
    runtime/precision_config.py), not the fp32 master the plan prices: refused where the
    estimate priced narrower moments (zero 1-2), a warning elsewhere."""
    f = plan.optimizer_offload
    if f:
        if plan.zero == 0:
            raise PartitaError(f"optimizer_offload={f:g}: DeepSpeed offloads the optimizer (offload_optimizer) with "
                               "ZeRO stage 1, 2 or 3 only; re-plan with --zero 1")
        if f < 1 and plan.zero < 3:
            raise PartitaError(f"optimizer_offload={f:g} with zero={plan.zero}: DeepSpeed offloads all of the "
                               "optimizer states (a fraction, offload_optimizer.ratio, is ZeRO-3 only); re-plan with "
                               "--optimizer-offload 1 or --zero 3")
        off = {"device": "cpu", "pin_memory": True}
        if f < 1:
            off["ratio"] = f
        cfg["zero_optimization"]["offload_optimizer"] = off
    if plan.moment_dtype != "fp32":
        if 1 <= plan.zero <= 2:
            raise PartitaError(f"moment_dtype={plan.moment_dtype}: ds_config stores Adam's moments narrower only with "
                               "bf16 master weights and gradients (bf16_optimizer_states, runtime/precision_config.py), "
                               "not beside an fp32 master; re-plan with --moment-dtype fp32, or export --to megatron")
        warn.append(f"moment_dtype={plan.moment_dtype}: not emitted (ds_config has no moments-only dtype); the "
                    f"estimate priced fp32 moments at zero={plan.zero} too")


def ds_config(plan: Plan) -> tuple[dict, list[str]]:
    _check_expressible(plan)
    if plan.recompute_modules and plan.recompute == "selective":
        raise PartitaError(f"recompute_modules {plan.recompute_modules}: DeepSpeed checkpoints the whole blocks the "
                           "model code wraps (deepspeed.checkpointing.checkpoint; ds_config has no module list); "
                           "re-plan with --recompute full, or export --to megatron")
    warn: list[str] = []
    cfg: dict = {
        # DeepSpeedConfig checks train_batch_size == micro x accumulation x its world size, which
        # counts AutoTP ranks too (no mpu: dist.get_world_size(), runtime/config.py) and a
        # PipelineModule's data-parallel ranks only (its grid is the mpu): world / pp either way
        "train_batch_size": plan.mbs * plan.grad_accum * (plan.world_size // plan.pp),
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": plan.zero, "overlap_comm": bool(plan.overlap_grad_reduce),
                              "contiguous_gradients": True},
        "steps_per_print": 10,
    }
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
        warn.append(f"tp={plan.tp}: DeepSpeed AutoTP training (tensor_parallel.autotp_size) shards the model's "
                    "linear layers automatically; sequence parallel and TP comm overlap are not expressed; "
                    f"train_batch_size {cfg['train_batch_size']} counts every AutoTP rank (DeepSpeedConfig without an "
                    f"mpu uses dist.get_world_size()): the tp groups read the same samples, {plan.gbs} sequences "
                    "per step")
    if plan.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif plan.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 1000}
    elif plan.dtype == "fp8":
        cfg["bf16"] = {"enabled": True}
        warn.append("dtype=fp8: ds_config has no fp8 GEMM switch (use Transformer Engine layers); emitted bf16")
    _comm_knobs(plan, cfg, warn)
    _optimizer_states(plan, cfg, warn)
    if plan.etp > 1:
        warn.append(f"etp={plan.etp}: ds_config has no expert tensor parallel option (DeepSpeed-MoE splits "
                    "experts by expert parallel only, in layer code); emitted none: every rank holds whole experts")
    if plan.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
        warn.append(f"recompute={plan.recompute}: DeepSpeed checkpoints what the model code wraps with "
                    "deepspeed.checkpointing.checkpoint; wrap every block"
                    + (" (whole-block, i.e. full recompute; no op-level selective policy)" if plan.recompute == "selective" else "")
                    + (f"; wrap only the first {plan.recompute_layers} blocks of each pipeline stage as planned "
                       "(recompute_layers; ds_config has no per-layer count)" if plan.recompute_layers else ""))
    if plan.pp > 1:
        cfg["pipeline"] = {"stages": plan.pp, "partition": "uniform"}
        warn.append(f"pp={plan.pp}: DeepSpeed takes the pipeline degree from PipelineModule(num_stages={plan.pp}, "
                    "partition_method='uniform') in your model code; ds_config's pipeline.stages is not read by it")
        if plan.schedule != "1f1b":
            warn.append(f"schedule={plan.schedule}: DeepSpeed pipelines run 1F1B; emitted 1F1B")
        if plan.zero == 0 and plan.dtype in ("bf16", "fp8"):
            warn.append("zero=0 with bf16 and pp > 1: DeepSpeed runs a bf16 PipelineModule without ZeRO with its "
                        "BF16_Optimizer, which partitions the fp32 master weights and optimizer states (ZeRO-1; "
                        "runtime/engine.py _do_optimizer_sanity_check)")
    unknown = set(cfg) - TOP_LEVEL_KEYS
    assert not unknown, unknown
    return cfg, warn


def export_deepspeed(ctx: ExportContext) -> Export:
    """A DeepSpeed ``ds_config.json`` (the model shape is in the user's model code, not the config)."""
    cfg, warn = ds_config(ctx.plan)
    return Export("deepspeed", json.dumps(cfg, indent=2) + "\n", warn, cfg)
