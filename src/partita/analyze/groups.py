"""Which parallel axis a process group serves, from what the trace says about it.

Kineto writes ``Process Group Name`` / ``Process Group Description`` / ``Process Group
Ranks`` on NCCL (and HCCL) kernels and on c10d's ``record_param_comms`` ops, and
``distributedInfo.pg_config`` lists the groups. The description is what names the axis:
torch's DeviceMesh creates groups described ``mesh_<dim>`` (torchtitan: ``mesh_tp``,
``mesh_dp_shard``, ``mesh_cp``, ...), Megatron-LM passes ``group_desc`` such as
``TENSOR_MODEL_PARALLEL_GROUP`` or ``EXPERT_DATA_PARALLEL_GROUP``. When the description says
nothing (``undefined``, a number), the group spanning the whole job is ``world`` and any
other is labelled by its shape, ``size N stride S`` (consecutive ranks, stride 1, are the
innermost axis: tensor parallel in Megatron's and torchtitan's default orders).
"""
from __future__ import annotations

import re

#: (axis, words any of which in the description names it); a group serving several axes
#: (Megatron's DATA_PARALLEL_GROUP_WITH_CP, torchtitan's mesh_dp_shard_cp) gets them joined
AXIS_WORDS = (
    ("tp", ("tensor", "tp")),
    ("cp", ("context", "cp")),
    ("pp", ("pipeline", "pp", "pipe", "embd", "embedding")),
    ("dp", ("data", "dp", "fsdp", "shard", "replicate", "ddp")),
)
EXPERT_WORDS = ("expert", "expt", "moe", "ep")


def _ranks(value) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(value)))


def process_groups(trace: dict) -> dict[str, dict]:
    """Groups the trace names, keyed by their ranks ("0,1" as :mod:`partita.analyze.breakdown`
    keys ``by_group_us``): ``{name, description, size}``."""
    groups: dict[str, dict] = {}
    info = trace.get("distributedInfo")
    for pg in (info.get("pg_config") or []) if isinstance(info, dict) else []:
        if isinstance(pg, dict) and pg.get("ranks"):
            key = ",".join(map(str, _ranks(pg["ranks"])))
            groups[key] = {"name": str(pg.get("pg_name", "")), "description": str(pg.get("pg_desc", "")),
                           "size": len(_ranks(pg["ranks"]))}
    for e in trace.get("traceEvents", []):
        args = e.get("args")
        if not isinstance(args, dict) or "Process Group Ranks" not in args:
            continue
        ranks = _ranks(args["Process Group Ranks"])
        key = ",".join(map(str, ranks))
        if key and key not in groups:
            groups[key] = {"name": str(args.get("Process Group Name", "")),
                           "description": str(args.get("Process Group Description", "")), "size": len(ranks)}
    return groups


def axis_of(description: str, ranks: tuple[int, ...], world: int | None) -> str:
    """The parallel axis of a group (see the module docstring for the rules)."""
    text = description.lower()
    tokens = set(re.split(r"[^a-z0-9]+", text))
    axes = [axis for axis, words in AXIS_WORDS if tokens & set(words)]
    if tokens & set(EXPERT_WORDS):  # Megatron's expert groups: EXPERT_{MODEL,TENSOR,DATA}_PARALLEL_GROUP
        return "etp" if "tp" in axes else "edp" if "dp" in axes else "ep"
    if axes:
        return "+".join(axes)
    if "default_pg" in text or (world and len(ranks) == world):
        return "world"
    if len(ranks) < 2:
        return f"size {len(ranks)}"
    strides = {b - a for a, b in zip(ranks, ranks[1:])}
    return f"size {len(ranks)} stride {strides.pop()}" if len(strides) == 1 else f"size {len(ranks)}"


def communication_by_axis(by_group_us: dict[str, float], groups: dict[str, dict], world: int | None) -> dict[str, float]:
    """Communication microseconds per inferred axis (groups of one axis summed)."""
    out: dict[str, float] = {}
    for key, us in by_group_us.items():
        desc = groups.get(key, {}).get("description", "")
        axis = axis_of(desc, _ranks(key), world)
        out[axis] = out.get(axis, 0.0) + us
    return dict(sorted(out.items()))
