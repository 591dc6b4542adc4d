"""Megatron-LM / MindSpeed-LLM command lines read back into a :class:`~partita.plan.Plan`
(issue 14 item 2; moved out of ``export/`` by issue 32).

Only the fields that decide the layout, batch, recompute and precision are read; everything else
in the command is ignored (``parse_known_args``). The flag spellings are the ones the exporters in
``partita.export`` write, which tests/test_export.py checks against each framework's own parser.
argparse is the parser of the foreign format here, not a command of ours.
"""
from __future__ import annotations

import argparse

from ..errors import PartitaError
from ..plan import Plan

FSDP_STRATEGY_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}

#: Size flags of a Megatron/MindSpeed command line: each a whole number from 1 (a 0 divides by zero).
MEGATRON_SIZES = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                  "--expert-model-parallel-size", "--micro-batch-size", "--global-batch-size", "--seq-length",
                  "--num-layers", "--num-layers-per-virtual-pipeline-stage", "--virtual-pipeline-model-parallel-size")


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
