"""DeepSpeed ``ds_config`` read back into a :class:`~partita.plan.Plan` (issue 14 item 2; moved out
of ``export/`` by issue 32), with the type checks of the keys it reads."""
from __future__ import annotations

from ..errors import PartitaError
from ..plan import Plan

#: DeepSpeed config keys the importer reads, and their JSON types.
_DS_INTS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_DS_OBJECTS = ("pipeline", "tensor_parallel", "bf16", "fp16", "zero_optimization")


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


def check_ds_config(path: str, cfg: dict) -> None:
    """The fields :func:`plan_from_ds_config` reads have DeepSpeed's types (else one line naming the key)."""
    from ..plan import MAX_PLAN_SIZE
    for key in _DS_OBJECTS:
        if key in cfg and not isinstance(cfg[key], dict):
            raise PartitaError(f"{path}: {key} must be a JSON object, got {cfg[key]!r}"[:200])
    ints = [(key, cfg.get(key)) for key in _DS_INTS]
    ints += [("pipeline.stages", cfg.get("pipeline", {}).get("stages")),
             ("tensor_parallel.autotp_size", cfg.get("tensor_parallel", {}).get("autotp_size")),
             ("zero_optimization.stage", cfg.get("zero_optimization", {}).get("stage"))]
    for key, value in ints:
        if value is None or (key == "pipeline.stages" and isinstance(value, str)):  # "auto" / unset
            continue
        low = 0 if key in ("zero_optimization.stage", "tensor_parallel.autotp_size") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_PLAN_SIZE:
            raise PartitaError(f"{path}: {key} must be a whole number from {low} to {MAX_PLAN_SIZE:,}, "
                               f"got {value!r}"[:200])
