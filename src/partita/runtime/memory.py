"""What a rank really holds: the gradient storage of a (parallelized) model, measured
from the tensors themselves, for tests and profiling against the planner's memory terms."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def held_gradient_bytes(modules: Iterable[nn.Module]) -> int:
    """Bytes of gradient storage alive now: every parameter's ``.grad`` (the local shard of a
    DTensor), and FSDP2's unsharded gradients and unsharded accumulation buffers (kept when
    gradient sync is off). Each storage is counted once, at its full size (a view of a
    larger buffer holds the whole buffer)."""
    storages: dict[int, int] = {}

    def add(t: torch.Tensor | None) -> None:
        if t is None:
            return
        if isinstance(t, DTensor):
            t = t._local_tensor
        s = t.untyped_storage()
        if s.nbytes():
            storages[s.data_ptr()] = s.nbytes()

    for mod in modules:
        for p in mod.parameters():
            add(p.grad)
        for sub in mod.modules():
            if not isinstance(sub, FSDPModule):
                continue
            for group in sub._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    add(fp.sharded_param.grad)
                    add(fp.unsharded_accumulated_grad)
                    unsharded = getattr(fp, "_unsharded_param", None)
                    add(unsharded.grad if unsharded is not None else None)
    return sum(storages.values())
