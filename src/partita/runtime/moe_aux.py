"""MoE load-balancing losses under pipeline parallel.

A pipeline schedule computes the loss from the last stage's output only, so a MoE layer
on an earlier stage cannot add its load-balancing loss to it. Instead each MoE layer's
output carries its aux loss into the backward (Megatron-Core's
``MoEAuxLossAutoScaler``, ``megatron/core/transformer/moe/moe_utils.py``): the forward
returns the output unchanged, the backward gives the aux loss the gradient it would get
had it been added to the micro-batch's loss (the coefficient; the schedule divides every
gradient by the micro-batch count at the end, as for the main loss). The values are
recorded so the step's reported loss still includes them.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models.llama import MoE
from .modules import blocks


class _AttachAux(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape, ctx.aux_dtype, ctx.aux_device = aux.shape, aux.dtype, aux.device
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return grad_out, torch.ones(ctx.aux_shape, dtype=ctx.aux_dtype, device=ctx.aux_device)


def recorded_aux_sum(record: dict[int, list], micro_batches: int) -> float:
    """Sum of the MoE aux losses of this step's last ``micro_batches`` forwards, every layer."""
    return sum(float(v) for values in record.values() for v in values[-micro_batches:])


def attach_aux_losses(module: nn.Module, record: dict[int, list]) -> None:
    """Make every MoE layer of ``module`` (a pipeline stage) backpropagate ``coef * aux``
    and append its value to ``record[id(layer)]`` (forward passes only, not recomputation)."""
    coef = getattr(getattr(module, "cfg", None), "aux_loss_coef", 0.0)
    for block in blocks(module):
        moe = getattr(block, "feed_forward", None)
        if not isinstance(moe, MoE):
            continue
        forward = moe.forward

        def wrapped(x: torch.Tensor, _forward=forward, _moe=moe) -> torch.Tensor:
            out = _forward(x)
            aux = coef * _moe.aux_loss.to(torch.float32)
            if torch._C._current_graph_task_id() == -1:  # not a recomputation inside backward
                record.setdefault(id(_moe), []).append(aux.detach())
            return _AttachAux.apply(out, aux)

        moe.forward = wrapped
