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
    if axis == "edp_tp":  # the edp ranks and their tp peers, which hold the same experts (etp = 1)
        return sorted(m - m % plan.tp + t for m in _ranks(plan, "edp", rank) for t in range(plan.tp))
    raise ValueError(axis)


def expert_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """A (pp, ep, edp_tp) mesh over which FSDP shards the routed experts.

    Each flattened dp x cp group splits into ``dp cp / ep`` expert-data-parallel (edp)
    replicas of ``ep`` consecutive members, the layout :func:`plan.axis_ranks` gives the
    ep axis (stride tp inside the flattened (dp, cp) axes: with dp = 1 the ep group is the
    cp group - Megatron-Core's MoE parallel folding, the experts' ep group drawn from
    dp x cp). With expert tensor parallel 1 the tp ranks of an edp replica hold the same
    experts and compute the same gradients, so the experts' data-parallel group is edp x
    tp (``dp cp tp / ep`` ranks, Megatron-Core's expert-data-parallel group, what the
    planner's memory model shards expert states over); the rest of the model is sharded
    over dp x cp (torchtitan's ``dp_shard_mod_ep`` mesh, with tp folded in)."""
    import torch
    edp = plan.dp * plan.cp // plan.ep
    grid = torch.arange(plan.world_size).view(plan.pp, edp, plan.ep, plan.tp).permute(0, 2, 1, 3)
    return DeviceMesh(device_type, grid.reshape(plan.pp, plan.ep, edp * plan.tp), mesh_dim_names=("pp", "ep", "edp_tp"))


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
