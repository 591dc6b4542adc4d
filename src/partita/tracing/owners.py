"""Backward FLOPs by the block whose forward created the autograd node that runs them.

``FlopCounterMode`` attributes backward FLOPs to modules through its module tracker, which
marks a module's backward as running from the first gradient reaching its outputs until the
gradients of *all* its inputs are computed. A diffusers ``ResnetBlock2D`` takes the time
embedding ``temb``, shared by every block: its gradient is complete only when the last block's
backward has run, so the tracker credits the first block with most of the UNet's backward
(measured on an SD-1.5-shaped UNet: the global count was right, 7.75e8, but a replayed block
copied that inflated figure: 3.42e9 with replay). Here each autograd node is tagged, when
forward creates it, with the unit running then (a walk from the unit's outputs back to nodes
already tagged: its inputs' nodes are tagged before it runs), and each backward op is credited
to the tag of the node executing it (``torch._C._current_autograd_node``) with the counter's
own formulas (its ``flop_registry``). The figures are exact per node; nothing is inferred
from hook timing.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_TAG = "partita_owner"


def tag(tree: Any, owner: str) -> None:
    """Tag every untagged autograd node behind the tensors of ``tree`` with ``owner``."""
    stack = [t.grad_fn for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or _TAG in node.metadata:
            continue
        node.metadata[_TAG] = owner
        stack.extend(n for n, _ in node.next_functions if n is not None)


class BackwardOwners(TorchDispatchMode):
    """Sums backward FLOPs (``flops[owner]``) by the tag of the autograd node running them."""

    def __init__(self, registry: dict) -> None:
        super().__init__()
        self.registry = registry
        self.flops: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        formula = self.registry.get(func._overloadpacket) if node is not None else None
        if formula is not None:
            owner = node.metadata.get(_TAG, "")
            self.flops[owner] = self.flops.get(owner, 0.0) + float(formula(*args, **kwargs, out_val=out))
        return out
