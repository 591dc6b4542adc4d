"""Activation recomputation per block: full, or op-level selective.

Applied by wrapping each block's ``forward`` in ``torch.utils.checkpoint`` (non-reentrant),
which keeps parameter names unchanged. Selective recomputation saves the outputs of every
other matmul and of attention and recomputes everything else - the policy the cost model
assumes (``cost/memory.py``; torchtitan's "op" SAC).

Partial full recompute (``plan.recompute_layers`` N > 0) wraps only the first N blocks of
each model chunk it is given (a pipeline stage / virtual chunk), the others run as with
recompute none - Megatron-LM's ``--recompute-method block`` (TransformerBlock
``_checkpointed_forward``: ``layer_idx < recompute_num_layers`` of the chunk's layers).
"""
from __future__ import annotations

import functools
from collections import defaultdict

import torch
from torch import nn
from .modules import blocks
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_ATTENTION_OPS = {getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")
    if hasattr(torch.ops.aten, name)}
_MM_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def _selective_context():
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op in _ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        if op in _MM_OPS:
            counts[mode] += 1
            return CheckpointPolicy.MUST_SAVE if counts[mode] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


#: pipeline schedules whose backward runs in two autograd calls per chunk (input gradients,
#: then weight gradients: torch's ScheduleInterleavedZeroBubble and ScheduleDualPipeV,
#: ``stage_backward_input`` / ``stage_backward_weight``)
SPLIT_BACKWARD_SCHEDULES = ("zero-bubble", "dualpipev")


def apply_recompute(model: nn.Module, mode: str, layers: int = 0, split_backward: bool = False) -> None:
    """Wrap every block of ``model.layers`` for ``mode`` in {"none", "selective", "full"};
    with ``layers`` N > 0 (``plan.recompute_layers``, full only) just the first N blocks of
    this chunk, in order.

    ``split_backward`` (a schedule of :data:`SPLIT_BACKWARD_SCHEDULES`): each checkpointed
    block is recomputed once per autograd call, twice per backward. torch's selective
    checkpoint hands each saved op output to one recomputation only and refuses the second
    ("Trying to backward an extra time ... selective activation checkpoint",
    torch/utils/checkpoint.py ``_CachedTorchDispatchMode``), so under such a schedule selective
    blocks are checkpointed whole, as full recompute does: the same gradients (recomputation
    never changes them), more recompute time and less activation memory than priced."""
    if mode == "none":
        return
    if mode == "selective" and split_backward:
        mode = "full"
    chosen = blocks(model)
    if layers and mode == "full":
        chosen = chosen[:layers]
    for block in chosen:
        forward = block.forward

        @functools.wraps(forward)
        def wrapped(*args, _forward=forward, **kwargs):
            if mode == "selective":
                return checkpoint(_forward, *args, use_reentrant=False, context_fn=_selective_context, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = wrapped
