"""The device mesh of a plan, in the axis order the cost model uses (plan.MESH_AXES)."""
from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..plan import MESH_AXES, Plan, axis_ranks


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """A (pp, dp, cp, tp) mesh over the world; rank r sits where :func:`plan.axis_ranks` says."""
    sizes = {"pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "tp": plan.tp}
    return init_device_mesh(device_type, tuple(sizes[a] for a in MESH_AXES), mesh_dim_names=MESH_AXES)


def new_subgroups(plan: Plan, axis: str) -> dist.ProcessGroup | None:
    """The process group of ``axis`` ('ep' or 'edp') containing this rank; every rank
    creates every group, in the same order, as ``new_group`` requires."""
    world, rank = dist.get_world_size(), dist.get_rank()
    seen: set[tuple[int, ...]] = set()
    mine = None
    for r in range(world):
        ranks = tuple(_ranks(plan, axis, r))
        if ranks in seen:
            continue
        seen.add(ranks)
        group = dist.new_group(list(ranks))
        if rank in ranks:
            mine = group
    return mine


def _ranks(plan: Plan, axis: str, rank: int) -> list[int]:
    if axis == "ep":
        return axis_ranks(plan, "ep", rank)
    if axis == "edp":  # same expert shard, other replicas: dp x cp ranks with the same ep index
        data_group = axis_ranks(plan, "dp_cp", rank)
        pos = data_group.index(rank)
        return [r for i, r in enumerate(data_group) if i % plan.ep == pos % plan.ep]
    raise ValueError(axis)


def expert_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """A (pp, edp, ep, tp) mesh: each flattened dp x cp group split into ``dp cp / ep``
    expert-data-parallel replicas of ``ep`` consecutive members, the layout
    :func:`plan.axis_ranks` gives the ep axis (stride tp inside the flattened (dp, cp)
    axes: with dp = 1 the ep group is the cp group - Megatron-Core's MoE parallel folding
    with expert tensor parallel 1, the experts' ep group drawn from dp x cp). FSDP shards
    the experts over ``edp`` (torchtitan's ``dp_shard_mod_ep`` mesh), the rest of the
    model over dp x cp."""
    import torch
    shape = (plan.pp, plan.dp * plan.cp // plan.ep, plan.ep, plan.tp)
    return DeviceMesh(device_type, torch.arange(plan.world_size).view(shape), mesh_dim_names=("pp", "edp", "ep", "tp"))


def hsdp_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """The dp axis as a 2-D (dp_replicate, dp_shard) mesh for HSDP: groups of ``dp_shard``
    consecutive dp ranks shard, the ``dp / dp_shard`` groups replicate (cp = 1). FSDP2 given
    a 2-D mesh reduce-scatters inside a group and all-reduces across groups."""
    import torch
    k = plan.dp_shard
    shape = (plan.pp, plan.dp // k, k, plan.cp, plan.tp)
    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    full = DeviceMesh(device_type, torch.arange(plan.world_size).view(shape), mesh_dim_names=names)
    return full["dp_replicate", "dp_shard"]
