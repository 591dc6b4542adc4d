"""``partita import`` at library level: read a Megatron-LM / MindSpeed-LLM launch command (or the
shell script holding it), a DeepSpeed ``ds_config`` or torchtitan ``--section.field`` overrides
back into a :class:`~partita.plan.Plan` (issue 14 item 2).

Only the fields that decide the layout, batch, recompute and precision are read; everything else
in the command is ignored (``parse_known_args``). The flag spellings are the ones the exporters in
this package write, which tests/test_export.py checks against each framework's own parser.
"""
from __future__ import annotations

import argparse
import shlex

from ..errors import PartitaError
from ..plan import Plan

FSDP_STRATEGY_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def argv_from_script(text: str, entry: str = "pretrain_gpt.py") -> list[str]:
    """The arguments after ``entry`` in a shell script or command line (``\\`` continuations and
    ``#`` comments handled; a text without ``entry`` is taken as bare arguments)."""
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    tokens = shlex.split("\n".join(lines).replace("\\\n", " "), comments=True)
    for i, tok in enumerate(tokens):
        if tok.endswith(entry):
            return tokens[i + 1:]
    return tokens


def _megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, default in (("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
                          ("--context-parallel-size", 1), ("--expert-model-parallel-size", 1),
                          ("--micro-batch-size", 1), ("--global-batch-size", None), ("--seq-length", 2048),
                          ("--num-layers", None), ("--num-layers-per-virtual-pipeline-stage", None)):
        p.add_argument(flag, type=int, default=default)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--use-torch-fsdp2",
                 "--bf16", "--fp16", "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    p.add_argument("--data-parallel-sharding-strategy", default="no_shard")
    p.add_argument("--recompute-granularity", default=None)
    p.add_argument("--recompute-method", default=None)
    p.add_argument("--recompute-num-layers", type=int, default=None)
    p.add_argument("--fp8-format", default=None)
    return p


def _layout_split(layout: str) -> tuple[int, ...]:
    """Decoder layers per virtual stage of ``--pipeline-model-parallel-layout`` (E/t*n/L entries)."""
    return tuple(int(s.split("t*")[1].rstrip("L")) if "t*" in s else 0 for s in layout.split("|"))


def plan_from_megatron(argv: list[str], world_size: int, layers: int | None = None) -> Plan:
    """The plan a Megatron-LM / MindSpeed-LLM ``pretrain_gpt.py`` command line runs on ``world_size`` ranks."""
    ns, _ = _megatron_parser().parse_known_args(argv)
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    if world_size % (tp * pp * cp):
        raise PartitaError(f"world size {world_size} is not a multiple of tp*pp*cp = {tp * pp * cp}")
    layers = layers or ns.num_layers
    vpp, split = 1, None
    if ns.pipeline_model_parallel_layout:
        split = _layout_split(ns.pipeline_model_parallel_layout)
        vpp = len(split) // pp
    elif ns.num_layers_per_virtual_pipeline_stage:
        if not layers:
            raise PartitaError("--num-layers-per-virtual-pipeline-stage needs --num-layers to give vpp")
        vpp = layers // (pp * ns.num_layers_per_virtual_pipeline_stage)
    if ns.use_megatron_fsdp:
        zero = FSDP_STRATEGY_ZERO.get(ns.data_parallel_sharding_strategy, 0)
    else:
        zero = 3 if ns.use_torch_fsdp2 else 1 if ns.use_distributed_optimizer else 0
    dtype = "fp8" if ns.fp8_format else "bf16" if ns.bf16 else "fp16" if ns.fp16 else "fp32"
    dp = world_size // (tp * pp * cp)
    ep = ns.expert_model_parallel_size
    # --expert-tensor-parallel-size absent means etp = tp in Megatron (arguments.py core_v0.16.1);
    # it matters only to a MoE run, known here by ep > 1
    etp = ns.expert_tensor_parallel_size or (tp if ep > 1 else 1)
    # full + block: only the first N layers of each chunk (plan.recompute_layers); full +
    # uniform recomputes every layer (groups of N share one checkpoint: still all layers)
    rc_layers = 0
    if ns.recompute_granularity == "full" and ns.recompute_method == "block" and ns.recompute_num_layers:
        rc_layers = ns.recompute_num_layers
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, sp=ns.sequence_parallel,
                zero=zero, mbs=ns.micro_batch_size, gbs=ns.global_batch_size or ns.micro_batch_size * dp,
                seq_len=ns.seq_length, recompute=ns.recompute_granularity or "none", dtype=dtype,
                recompute_layers=rc_layers, schedule="interleaved-1f1b" if vpp > 1 else "1f1b", layer_split=split,
                tp_comm_overlap=ns.tp_comm_overlap, overlap_grad_reduce=ns.overlap_grad_reduce,
                overlap_param_gather=ns.overlap_param_gather)


def plan_from_ds_config(cfg: dict, world_size: int, seq_len: int = 2048, pp: int | None = None) -> Plan:
    """The plan a DeepSpeed ``ds_config`` runs on ``world_size`` ranks; ``pp`` is what the model code
    passes to ``PipelineModule(num_stages=...)`` (defaults to ``pipeline.stages`` when numeric)."""
    stages = cfg.get("pipeline", {}).get("stages")
    pp = pp or (stages if isinstance(stages, int) else 1)
    tp = cfg.get("tensor_parallel", {}).get("autotp_size", 0) or 1
    if world_size % (tp * pp):
        raise PartitaError(f"world size {world_size} is not a multiple of tp*pp = {tp * pp}")
    dp = world_size // (tp * pp)
    mbs = cfg.get("train_micro_batch_size_per_gpu", 1)
    gbs = cfg.get("train_batch_size") or mbs * cfg.get("gradient_accumulation_steps", 1) * dp
    dtype = "bf16" if cfg.get("bf16", {}).get("enabled") else "fp16" if cfg.get("fp16", {}).get("enabled") else "fp32"
    zero = cfg.get("zero_optimization", {})
    return Plan(dp=dp, tp=tp, pp=pp, zero=int(zero.get("stage", 0)), mbs=mbs, gbs=gbs, seq_len=seq_len,
                recompute="full" if "activation_checkpointing" in cfg else "none", dtype=dtype,
                overlap_grad_reduce=bool(zero.get("overlap_comm", False)))


def _titan_values(argv: list[str]) -> tuple[dict, str]:
    """{"section.field": value} of tyro overrides (``--x`` True, ``--no_x`` False) and the AC subcommand."""
    values: dict = {}
    ac = "selective"  # Trainer.Config's default
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("activation_checkpoint:") or tok.startswith("activation-checkpoint:"):
            ac = tok.split(":", 1)[1]
        elif tok.startswith("--") and "." in tok:
            section, field = tok[2:].split(".", 1)
            if i + 1 < len(argv) and not argv[i + 1].startswith("--") and ":" not in argv[i + 1]:
                values[f"{section}.{field}"] = argv[i + 1]
                i += 1
            elif field.startswith("no_"):
                values[f"{section}.{field[3:]}"] = False
            else:
                values[f"{section}.{field}"] = True
        i += 1
    return values, ac


def plan_from_torchtitan(argv: list[str], layers: int | None = None) -> Plan:
    """The plan torchtitan 0.3.0 overrides describe (unset degrees at torchtitan's defaults of 1)."""
    v, ac = _titan_values(argv)
    num = lambda key, default=1: int(v.get(key, default))  # noqa: E731
    rep, shard = num("parallelism.data_parallel_replicate_degree"), num("parallelism.data_parallel_shard_degree")
    tp, pp = num("parallelism.tensor_parallel_degree"), num("parallelism.pipeline_parallel_degree")
    zero = 0 if shard == 1 else 3 if v.get("parallelism.fsdp_reshard_after_forward", "default") != "never" else 2
    vpp, split = 1, None
    lps = v.get("parallelism.pipeline_parallel_layers_per_stage")
    if pp > 1 and lps is not None:
        lps = int(lps)
        first, last = num("parallelism.pipeline_parallel_first_stage_less_layers", 1), \
            num("parallelism.pipeline_parallel_last_stage_less_layers", 1)
        if layers is None:
            raise PartitaError("torchtitan's pipeline_parallel_layers_per_stage needs the model's layer count")
        stages = -(-(layers + first + last) // lps)
        vpp = stages // pp
        if first or last:
            split = (lps - first,) + (lps,) * (stages - 2) + (lps - last,)
    dp = rep * shard
    mbs = num("parallelism.pipeline_parallel_microbatch_size") if pp > 1 else num("training.local_batch_size")
    param = v.get("training.mixed_precision_param", "bfloat16")
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=num("parallelism.context_parallel_degree"),
                ep=num("parallelism.expert_parallel_degree"), sp=bool(v.get("parallelism.enable_sequence_parallel", True)),
                zero=zero, mbs=mbs, gbs=num("training.global_batch_size", mbs * dp),
                seq_len=num("training.seq_len", 2048), recompute=ac, dtype="fp32" if param == "float32" else "bf16",
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", layer_split=split)
