"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is split into ``pp * vpp`` virtual stages by the plan's layer split; virtual
stage ``j`` runs on pipeline rank ``j % pp`` (Megatron's interleaving, the same
placement the cost model assumes), or with ``schedule="dualpipev"`` on the rank of
DualPipeV's V (:func:`partita.plan.chunk_ranks`: ``j`` for ``j < pp``, else ``2 pp - 1 - j``;
torch's ``ScheduleDualPipeV`` places stages so, and it runs the plan's two chunks per
rank). torch runs DualPipeV's overlapped forward+backward pairs one after the other unless
a custom ``OVERLAP_F_B`` function is registered: the all-to-all hiding the cost model
credits (cost/pipeline.py) is not done by this runtime, its schedule and results are.
Each stage is a copy of the model that keeps only its
layers (names unchanged), the embedding on the first and the norm + output on the last.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)

from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining._backward import stage_backward
from torch.distributed.pipelining.schedules import FORWARD, _Action, _add_send_recv, _add_unshard_reshard

from ..errors import PartitaError
from ..models.registry import family_of
from ..plan import Plan, axis_index, chunk_ranks
from .hf_pipeline import hf_stage
from .modules import blocks


class ShardedAccumulationStage(PipelineStage):
    """A pipeline stage whose FSDP gradients are reduce-scattered after every micro-batch.

    torch's ``PipelineStage.backward_maybe_with_nosync`` turns FSDP gradient sync off for
    every micro-batch and reduces once at the end (unsharded accumulation: the full
    gradient is held). With ``grad_accum_mode="sharded"`` (ZeRO-2/3) this stage keeps sync
    on, so each full backward reduce-scatters into the gradient shard; the schedule's final
    ``perform_reduce_grad`` then finds no unsharded gradient left and only scales."""

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        if not isinstance(self.submod, FSDPModule) or backward_type != "full":
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        self.submod.set_requires_gradient_sync(True)
        self.submod.set_reshard_after_backward(True)
        grads = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"], bwd_kwargs["input_values"])
        return grads, None


def forward_only_order(owner: tuple[int, ...], m: int) -> dict[int, list[_Action]]:
    """Each pipeline rank's forward-only order for ``m`` micro-batches, chunk ``j`` on rank
    ``owner[j]`` (the plan's placement, :func:`partita.plan.chunk_ranks`): every micro-batch
    through the rank's chunks in layer order. Under DualPipeV's V that is the first chunk
    (the descending leg), then the second (the ascending leg); no cycle: a chunk waits only
    on chunks of lower index, which every rank runs before its later ones."""
    return {r: [_Action(j, FORWARD, i) for j in range(len(owner)) if owner[j] == r for i in range(m)]
            for r in range(max(owner) + 1)}


class DualPipeVSchedule(ScheduleDualPipeV):
    """torch's ScheduleDualPipeV with a forward-only order for ``eval``: torch 2.13 runs eval
    through the training order (its backward actions fail with "can't steal_bwd_input if this
    stage doesn't have backward"), so eval lowers, for the time of the call, the order of
    :func:`forward_only_order` on the plan's placement (``placement``: the rank of each
    chunk, :func:`partita.plan.chunk_ranks` - the one definition the stages are built from,
    checked against torch's own V mapping here) by torch's own ``_add_unshard_reshard`` and
    ``_add_send_recv`` (``_prepare_schedule_with_comms`` would first validate it as a training
    order, which demands every backward)."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int, *, placement: tuple[int, ...], **kwargs):
        super().__init__(stages, n_microbatches, **kwargs)
        self.placement = tuple(placement)
        torch_v = [self.stage_index_to_group_rank[j] for j in sorted(self.stage_index_to_group_rank)]
        if list(self.placement) != torch_v:  # the stages were built for the plan's placement
            raise PartitaError(f"the plan places the DualPipeV chunks on ranks {list(self.placement)}, torch's "
                               f"ScheduleDualPipeV on {torch_v}")

    def eval(self, *args, **kwargs):
        train = self.pipeline_order_with_comms
        forward = forward_only_order(self.placement, self._n_microbatches)
        try:
            self.pipeline_order_with_comms = _add_send_recv(
                {r: _add_unshard_reshard(ops) for r, ops in forward.items()},
                stage_to_rank=lambda s: self.placement[s], num_stages=self._num_stages)
            return super().eval(*args, **kwargs)
        finally:
            self.pipeline_order_with_comms = train


def stage_modules(model: nn.Module, plan: Plan) -> list[tuple[int, nn.Module]]:
    """(virtual stage index, module) for the stages of this pipeline rank."""
    split = plan.stage_layers(len(blocks(model)))
    pp_rank = _pp_rank(plan)
    owner = chunk_ranks(plan.pp, plan.vpp, plan.schedule)
    out = []
    start = 0
    for j, n in enumerate(split):
        keep = {str(i) for i in range(start, start + n)}
        start += n
        if owner[j] != pp_rank:
            continue
        if family_of(model).name == "hf":
            out.append((j, hf_stage(model, [int(i) for i in sorted(keep, key=int)], j == 0, j == len(split) - 1)))
            continue
        # buffers (the RoPE tables) are constants: every stage shares the model's instead of
        # holding a copy (a deep copy duplicated them on each stage of a rank)
        stage = copy.deepcopy(model, {id(b): b for b in model.buffers()})
        for name in list(stage.layers.keys()):
            if name not in keep:
                del stage.layers[name]
        if j != 0:
            stage.tok_embeddings = None
        if j != len(split) - 1:
            stage.norm = None
            stage.output = None
        out.append((j, stage))
    return out


def _pp_rank(plan: Plan) -> int:
    return axis_index(plan, "pp", dist.get_rank())


def build_schedule(stages: list[tuple[int, nn.Module]], plan: Plan, device: torch.device,
                   group: dist.ProcessGroup, loss_fn) -> object:
    n_stages = plan.pp * plan.vpp
    stage_cls = ShardedAccumulationStage if plan.zero >= 2 and plan.grad_accum_mode == "sharded" else PipelineStage
    pipe_stages = [stage_cls(mod, j, n_stages, device, group=group) for j, mod in stages]
    m = plan.grad_accum
    if plan.schedule == "gpipe":
        return ScheduleGPipe(pipe_stages[0], m, loss_fn=loss_fn)
    if plan.schedule == "1f1b":
        if m < plan.pp:
            raise PartitaError(f"1F1B needs at least pp={plan.pp} micro-batches, the plan has {m}")
        return Schedule1F1B(pipe_stages[0], m, loss_fn=loss_fn)
    if plan.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(pipe_stages, m, loss_fn=loss_fn)
    if plan.schedule == "zero-bubble":
        return ScheduleInterleavedZeroBubble(pipe_stages, m, loss_fn=loss_fn)
    if plan.schedule == "dualpipev":  # this rank's chunks of the plan's V (stage_modules)
        return DualPipeVSchedule(pipe_stages, m, loss_fn=loss_fn,
                                 placement=chunk_ranks(plan.pp, plan.vpp, plan.schedule))
    raise PartitaError(f"unknown pipeline schedule {plan.schedule}")
