"""torchtitan settings for a plan, as torchtitan 0.3.0 spells them: tyro CLI overrides
``--section.field value`` read by ``torchtitan.config.ConfigManager`` (torchtitan/config/manager.py).

Sources (torchtitan 0.3.0 as installed from PyPI):
* field names and types: ``torchtitan/config/configs.py`` (``ParallelismConfig``, ``TrainingConfig``);
  ``mixed_precision_param`` is ``Literal["bfloat16", "float32"]``.
* booleans are tyro flags: ``--section.x`` sets True, ``--section.no_x`` sets False.
* activation checkpointing is a tyro subcommand (``activation_checkpoint:none|selective|full``,
  ``torchtitan/distributed/activation_checkpoint.py`` ``ActivationCheckpointingConfig``).
* ``Trainer.Config.__post_init__`` (trainer.py): CUDA graphs must be disabled with pp > 1 (and with
  ep > 1 unless the dispatcher is CPU-sync free), ``local_batch_size % pipeline_parallel_microbatch_size == 0``.
* stage split (``distributed/pipeline_parallel.py``): ``ceil((L + first_less + last_less) / layers_per_stage)``
  virtual stages; without ``layers_per_stage`` a multi-stage schedule gets 2 stages per rank.
* expert mesh (``distributed/parallel_dims.py`` ``build_mesh``): ``efsdp = dp_shard * cp * tp // ep``.
"""
from __future__ import annotations

from ..errors import PartitaError
from ..plan import Plan
from .context import ExportContext
from .result import Export

PARALLELISM_FIELDS = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                      "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
                      "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
                      "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                      "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                      "context_parallel_degree", "context_parallel_load_balancer", "context_parallel_ptrr_mask_key",
                      "expert_parallel_degree"}
TRAINING_FIELDS = {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload",
                   "disable_cuda_graphs", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq", "gc_debug"}
PRECISION = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32"}


def _check_expressible(plan: Plan) -> None:
    """Refuse what torchtitan 0.3.0 cannot run as planned (one line each, with the reason)."""
    if plan.dtype == "fp16":
        raise PartitaError("dtype=fp16: torchtitan 0.3.0 accepts --training.mixed_precision_param bfloat16 or "
                           "float32 only (config/configs.py TrainingConfig); re-plan with --dtype bf16")
    shard = plan.dp if plan.zero else 1
    if plan.ep > 1 and (shard * plan.cp * plan.tp) % plan.ep:
        raise PartitaError(f"zero={plan.zero} with ep={plan.ep}: torchtitan builds the expert mesh from the FSDP axis "
                           f"(efsdp = dp_shard*cp*tp/ep = {shard}*{plan.cp}*{plan.tp}/{plan.ep}, "
                           "distributed/parallel_dims.py) which is not whole; re-plan with --zero 1 or more "
                           "(dp_shard = dp) or export to megatron")


def _optimizer_states(plan: Plan, train: dict, warn: list[str]) -> None:
    """The optimizer-state fields as torchtitan 0.3.0 can run them (one-line refusals otherwise).

    ``optimizer_offload``: torchtitan's only offload is ``training.enable_cpu_offload`` (FSDP2's
    ``CPUOffloadPolicy``, given to ``apply_fsdp`` by each model's parallelize.py: "CPU offloading of
    parameters, gradients, and optimizer states in FSDP", config/configs.py), all or nothing and
    only where FSDP wraps the model (``ParallelDims.fsdp_enabled``: dp_shard > 1 or cp > 1). So a
    whole offload under FSDP maps to it (the device then also sheds the parameters and gradients:
    less memory than planned, more host traffic); a fraction, or no FSDP, is refused.
    ``moment_dtype``: torchtitan's optimizers (components/optimizer) keep torch's Adam states in the
    parameters' fp32 dtype and have no option for it: refused where the estimate priced narrower
    moments (zero 1-2, cost/states.moment_saving), a warning elsewhere."""
    f = plan.optimizer_offload
    if f:
        fsdp = plan.zero >= 1 and (plan.dp > 1 or plan.cp > 1)
        if f < 1 or not fsdp:
            raise PartitaError(f"optimizer_offload={f:g}: torchtitan 0.3.0 offloads only everything FSDP holds "
                               "(training.enable_cpu_offload: parameters, gradients and optimizer states) and only "
                               "under FSDP; re-plan with --optimizer-offload 1 and --zero >= 1 with dp or cp > 1, "
                               "or export --to megatron")
        train["enable_cpu_offload"] = True
        warn.append("optimizer_offload=1: emitted training.enable_cpu_offload (FSDP2 CPUOffloadPolicy), which "
                    "offloads the parameters and gradients too: less device memory than planned, more host "
                    "traffic, and the optimizer step on the CPU")
    if plan.moment_dtype != "fp32":
        if 1 <= plan.zero <= 2:
            raise PartitaError(f"moment_dtype={plan.moment_dtype}: torchtitan 0.3.0 has no optimizer-state dtype "
                               "option (its Adam keeps fp32 moments); re-plan with --moment-dtype fp32, or export "
                               "--to megatron")
        warn.append(f"moment_dtype={plan.moment_dtype}: not emitted (torchtitan has no option for it); the estimate "
                    f"priced fp32 moments at zero={plan.zero} too")


def _pipeline(plan: Plan, layers: int | None, warn: list[str]) -> dict:
    """Schedule, micro-batch and the exact layers of every virtual stage."""
    par: dict = {"pipeline_parallel_microbatch_size": plan.mbs}
    if plan.schedule == "dualpipev":  # torch's ScheduleDualPipeV by name (get_schedule_class); torchtitan places
        # its two stages per rank in a V (distributed/pipeline_parallel.py: style "v" for ScheduleDualPipeV)
        par["pipeline_parallel_schedule"] = "DualPipeV"
    elif plan.vpp > 1:
        par["pipeline_parallel_schedule"] = "InterleavedZeroBubble" if plan.schedule == "zero-bubble" else "Interleaved1F1B"
        if plan.schedule == "gpipe":
            warn.append("schedule=gpipe with vpp > 1: emitted Interleaved1F1B")
    else:
        par["pipeline_parallel_schedule"] = "GPipe" if plan.schedule == "gpipe" else "1F1B"
        if plan.schedule not in ("1f1b", "gpipe"):
            warn.append(f"schedule={plan.schedule} with vpp 1: emitted 1F1B")
    if plan.layer_split:
        split = tuple(plan.layer_split)
        middle = split[1:-1]
        per = middle[0] if middle else max(split)
        if any(n != per for n in middle) or split[0] > per or split[-1] > per:
            raise PartitaError(f"layer_split {','.join(map(str, split))}: torchtitan expresses uneven splits only as "
                               "lighter first/last stages (pipeline_parallel_first/last_stage_less_layers); "
                               "export to megatron (pipeline layout)")
        first, last = per - split[0], per - split[-1]
    else:
        if layers is None:
            if plan.vpp == 1:
                return {**par, "pipeline_parallel_first_stage_less_layers": 0,
                        "pipeline_parallel_last_stage_less_layers": 0}
            raise PartitaError("exporting vpp > 1 to torchtitan needs --model (layers per virtual stage)")
        stages = plan.pp * plan.vpp
        if layers % stages:
            raise PartitaError(f"{layers} layers do not divide into pp*vpp = {stages} equal stages; "
                               "give the plan a layer split")
        per, first, last = layers // stages, 0, 0
    return {**par, "pipeline_parallel_layers_per_stage": per, "pipeline_parallel_first_stage_less_layers": first,
            "pipeline_parallel_last_stage_less_layers": last}


def torchtitan_settings(plan: Plan, model=None) -> tuple[dict[str, dict], str, list[str]]:
    """({section: {field: value}}, activation-checkpoint subcommand, warnings)."""
    _check_expressible(plan)
    if plan.recompute_modules and plan.recompute == "selective":
        raise PartitaError(f"recompute_modules {plan.recompute_modules}: torchtitan 0.3.0's activation checkpointing "
                           "is none, selective (per-op), full or memory-budget, with no module list "
                           "(distributed/activation_checkpoint.py); re-plan with --recompute full, or export --to "
                           "megatron")
    warn: list[str] = []
    if plan.zero in (1, 2):
        warn.append(f"zero={plan.zero}: torchtitan shards with FSDP2 only; emitted FSDP without resharding after "
                    "forward (fsdp_reshard_after_forward=never, ZeRO-2-like), which needs no more memory than "
                    "the plan's ZeRO-1/2")
    par: dict = {"tensor_parallel_degree": plan.tp, "enable_sequence_parallel": bool(plan.sp),
                 "pipeline_parallel_degree": plan.pp, "context_parallel_degree": plan.cp,
                 "expert_parallel_degree": plan.ep}
    if plan.zero == 0:
        par.update(data_parallel_replicate_degree=plan.dp, data_parallel_shard_degree=1)
    else:
        par.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=plan.dp,
                   fsdp_reshard_after_forward="always" if plan.zero == 3 else "never")
    if plan.pp > 1:
        par.update(_pipeline(plan, model.layers if model is not None else None, warn))
    # local_batch_size is one data-parallel rank's batch per optimizer step with pp (the schedule cuts
    # it into pipeline micro-batches) and one micro-batch without (torchtitan accumulates
    # global / (local * dp) times): trainer.py gradient accumulation.
    local = plan.gbs // plan.dp if plan.pp > 1 else plan.mbs
    train: dict = {"local_batch_size": local, "global_batch_size": plan.gbs, "seq_len": plan.seq_len,
                   "max_norm": 1.0, "mixed_precision_param": PRECISION[plan.dtype], "mixed_precision_reduce": "float32"}
    if plan.grad_dtype == "bf16" and plan.dtype != "fp32":
        warn.append("grad_dtype=bf16: torchtitan 0.3.0's training.mixed_precision_reduce accepts only float32; "
                    "emitted float32 (twice the planned dp gradient bytes)")
    if plan.etp > 1:
        warn.append(f"etp={plan.etp}: torchtitan 0.3.0 has no expert tensor parallel option "
                    "(parallelism.expert_tensor_parallel_degree was removed after 0.2.2; its experts are split by "
                    f"ep and sharded by FSDP only); emitted etp 1: each rank holds {plan.etp}x the planned expert "
                    "weights before FSDP sharding, without the etp token all-gather")
    if plan.grad_compression == "powersgd" or plan.fsdp_prefetch != 1 or plan.ddp_bucket_mb:
        warn.append("grad_compression / fsdp_prefetch / ddp_bucket_mb: torchtitan has no option for them "
                    "(FSDP2/DDP from its own parallelize code); emitted its defaults, uncompressed")
    _optimizer_states(plan, train, warn)
    if plan.pp > 1 or plan.ep > 1:
        train["disable_cuda_graphs"] = True  # Trainer.Config._validate_cuda_graphs
    if plan.dtype == "fp8":
        warn.append("dtype=fp8: enable torchtitan's float8 converter in your config (e.g. --module llama3 "
                    "--config llama3_debugmodel_float8); not a parallelism/training field")
    ac = plan.recompute
    if plan.recompute_layers:
        # 0.3.0's AC subcommands are none | selective (per-op SAC) | full | memory-budget
        # (distributed/activation_checkpoint.py ActivationCheckpointingConfig); the layer-wise
        # selective_ac_option = "k" of earlier releases is gone, so no frequency can match
        warn.append(f"recompute_layers={plan.recompute_layers}: torchtitan 0.3.0 has no layer-wise activation "
                    "checkpointing (selective_ac_option was removed); emitted full AC on every block: less "
                    "activation memory and more recompute than planned")
    if ac == "selective":
        warn.append(_selective_warning(plan, model))
    for section, fields, allowed in (("parallelism", par, PARALLELISM_FIELDS), ("training", train, TRAINING_FIELDS)):
        bad = set(fields) - allowed
        assert not bad, (section, bad)
    return {"parallelism": par, "training": train}, ac, warn


def _selective_warning(plan: Plan, model=None) -> str:
    """The warning for a selective plan: torchtitan's SelectiveAC is op-level SAC (its save list,
    distributed/activation_checkpoint.py), close to Partita's estimate only where the estimate priced
    op-level SAC. Under framework megatron / mindspeed the estimate priced Megatron-Core's module
    recompute (:func:`partita.cost.frameworks.selective_modules`: core_attn by default), which
    (dense llama3-8b) keeps more activations than op-level SAC and reruns other work (the core attention, where SAC saves
    its output and reruns part of the GEMMs and the element-wise ops: less recompute at long
    sequences, more at short ones): say so, with both memory figures when the model is known
    (cost/activations.py prices both), as export/megatron.py does the other way round."""
    from ..cost.frameworks import selective_modules
    modules = selective_modules(plan.framework, plan.recompute, plan.recompute_modules)
    if not modules:
        return ("recompute=selective: torchtitan's SelectiveAC saves its own op list (op-level), "
                "close to partita's selective estimate")
    names = ",".join(sorted(modules))
    head = (f"recompute=selective: the estimate priced Megatron's module recompute ({names}, framework "
            f"{plan.framework}); torchtitan's SelectiveAC is op-level SAC (it saves the "
            "attention output and reruns part of the GEMMs and the element-wise ops instead)")
    tail = "; re-estimate with --framework torchtitan"
    if model is None:
        return head + ": the activation memory and the recompute differ" + tail
    from ..cost.activations import activation_bytes_per_layer
    moe = bool(model.moe)
    priced = activation_bytes_per_layer(model, plan, moe)
    titan = activation_bytes_per_layer(model, plan.with_(framework="torchtitan"), moe)
    return (head + f": torchtitan keeps {titan / 2**20:,.1f} MiB of activations a layer per micro-batch where the "
            f"estimate priced {priced / 2**20:,.1f} MiB ({(titan - priced) / 2**20:+,.1f} MiB)" + tail)


def torchtitan_flags(sections: dict[str, dict], ac: str) -> list[str]:
    """tyro command-line tokens: booleans as ``--x`` / ``--no_x``, then the AC subcommand last."""
    flags: list[str] = []
    for section, fields in sections.items():
        for key, value in fields.items():
            if isinstance(value, bool):
                flags.append(f"--{section}.{key}" if value else f"--{section}.no_{key}")
            else:
                flags += [f"--{section}.{key}", str(value)]
    return flags + [f"activation_checkpoint:{ac}"]


def export_torchtitan(ctx: ExportContext) -> Export:
    """torchtitan ``--section.field`` overrides (the model's layers give vpp's layers per stage)."""
    sections, ac, warn = torchtitan_settings(ctx.plan, ctx.model)
    flags = torchtitan_flags(sections, ac)
    lines = ["# partita export --to torchtitan: overrides for torchtitan 0.3.0's trainer",
             "# (python -m torchtitan.train --module <your model module> --config <your config> <these flags>)"]
    lines += [f"# WARNING: {w}" for w in warn]
    rows: list[str] = []
    for tok in flags:
        if tok.startswith("--") or tok.startswith("activation_checkpoint:") or not rows:
            rows.append(tok)
        else:
            rows[-1] += f" {tok}"
    lines.append(" \\\n".join(rows))
    return Export("torchtitan", "\n".join(lines) + "\n", warn,
                  {"sections": sections, "activation_checkpoint": ac, "flags": flags})
