"""Pipeline parallel for traced models whose forward is a block sequence (issue 19).

Any model whose repeated blocks form one run (:attr:`BlockLayout.pipeline`) and are called
in order with the hidden state as their first argument, returning the next hidden state
(a ViT's encoder layers, a DiT's transformer blocks), is split over ``pp`` ranks without
knowing its forward: every stage runs the model's own forward with hooks -

* the blocks before the stage's first return their input unchanged (no work), and the
  stage's first block gets the activation received from the previous stage instead;
* after the stage's last block the output is sent on and the forward stops (an exception
  the stage catches), so the layers after it never run;
* the last stage runs to the model's output and the loss.

Schedule: GPipe [Huang et al. 2019] - every micro-batch forward, then every backward in
reverse, activation gradients sent back stage to stage. Each rank updates the parameters
that received gradients on it: its blocks, and the stem (first stage) or head (last).
Parameters used on more than one stage (a head that reuses a block's submodule) have
their gradients summed over the stages. Known gaps: every stage keeps the whole model's parameters (only its own are trained);
the stem runs on every stage (its output is replaced); pp combines with dp (zero 0, the
gradients averaged over each stage's replicas) but not with tp or with sharded optimizer
states (one line says so).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import PartitaError
from ..plan import Plan
from ..tracing.blocks import find_blocks

_HEADER = 8  # dims of an activation's shape header (ndim, then the sizes)


def split_micro_batches(inputs: Any, m: int) -> list[Any]:
    """``m`` micro-batches of ``inputs`` along dim 0 (tensors with a batch dimension)."""
    leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.dim()]
    batch = leaves[0].shape[0] if leaves else 0
    if batch % m:
        raise PartitaError(f"this rank's batch of {batch} samples does not split into {m} micro-batches")
    size = batch // m
    return [tree_map(lambda t: t[i * size:(i + 1) * size] if isinstance(t, torch.Tensor) and t.dim()
                     and t.shape[0] == batch else t, inputs) for i in range(m)]


class _Stop(Exception):
    """Raised after a non-last stage's last block: the rest of the forward is another stage's."""


def _send(t: torch.Tensor, dst: int) -> None:
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = t.dim()
    header[1:1 + t.dim()] = torch.tensor(t.shape)
    dist.send(header, dst)
    dist.send(t.detach().contiguous(), dst)


def _recv(src: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    header = torch.zeros(_HEADER, dtype=torch.int64)
    dist.recv(header, src)
    shape = tuple(int(d) for d in header[1:1 + int(header[0])])
    t = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(t, src)
    return t


class TracedPipeline:
    """One pipeline stage of a traced model; :meth:`train_step` runs one GPipe step."""

    def __init__(self, model: nn.Module, plan: Plan, optimizer: torch.optim.Optimizer, device: torch.device):
        layout = find_blocks(model)
        if not layout.pipeline:
            raise PartitaError(f"pp={plan.pp} needs one sequence of repeated blocks; {type(model).__name__}'s "
                               "blocks are not one run in one container")
        missing = ([f"tp={plan.tp} beside pp (a TP plan inside a pipeline stage)"] if plan.tp > 1 else []) + \
            ([f"zero={plan.zero} beside pp and dp={plan.dp} (sharded states per stage; pp x dp runs zero 0)"]
             if plan.dp > 1 and plan.zero >= 1 else []) + \
            ([f"zero={plan.zero} in a pipeline (runs zero 0/1)"] if plan.dp == 1 and plan.zero >= 2 else [])
        if missing:
            raise PartitaError("the traced pipeline runtime does not run " + "; ".join(missing))
        blocks = [model.get_submodule(p) for p in layout.run]
        if plan.pp > len(blocks):
            raise PartitaError(f"pp={plan.pp} exceeds the {len(blocks)} blocks of {type(model).__name__}")
        self.module, self.plan, self.optimizer, self.device = model, plan, optimizer, device
        self._groups(plan)
        n, p = len(blocks), plan.pp
        sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
        lo = sum(sizes[:self.stage])
        hi = lo + sizes[self.stage]
        self.dtype = next(model.parameters()).dtype
        self.units = blocks[lo:hi]
        self._incoming: torch.Tensor | None = None
        self._outgoing: torch.Tensor | None = None
        for block in blocks[:lo]:
            block.forward = lambda *args, **kwargs: args[0] if args else kwargs["hidden_states"]
        if self.stage > 0:
            blocks[lo].register_forward_pre_hook(self._replace_input, with_kwargs=True)
        if self.stage < p - 1:
            blocks[hi - 1].register_forward_hook(self._stop)

    def _groups(self, plan: Plan) -> None:
        """This rank's stage and dp replica in the mesh order (pp, dp) - rank = stage * dp +
        replica, the order :mod:`partita.runtime.mesh` and the cost model use - and the
        process groups of its replica's stages (pp) and its stage's replicas (dp). Every
        rank creates every group, in the same order, as ``new_group`` requires."""
        rank, dp = dist.get_rank(), plan.dp
        self.stage, self.stages, self.replica = rank // dp, plan.pp, rank % dp
        self.pp_group = self.dp_group = None
        if dp > 1:
            for r in range(dp):
                group = dist.new_group([s * dp + r for s in range(plan.pp)])
                self.pp_group = group if r == self.replica else self.pp_group
            for s in range(plan.pp):
                group = dist.new_group([s * dp + r for r in range(dp)])
                self.dp_group = group if s == self.stage else self.dp_group

    def peer(self, stage: int) -> int:
        """Global rank of ``stage`` of this rank's replica."""
        return stage * self.plan.dp + self.replica

    def _replace_input(self, module, args, kwargs):
        if args:
            return (self._incoming, *args[1:]), kwargs
        return args, dict(kwargs, hidden_states=self._incoming)

    def _stop(self, module, args, out):
        self._outgoing = out[0] if isinstance(out, tuple) else out
        raise _Stop

    def _forward(self, chunk: Any, loss_fn: Callable) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(received activation or None, the stage's output or the last stage's loss)."""
        received = None
        if self.stage > 0:
            received = _recv(self.peer(self.stage - 1), self.dtype, self.device).requires_grad_()
            self._incoming = received
        try:
            out = self.module(**chunk) if isinstance(chunk, dict) else self.module(*chunk)
        except _Stop:
            _send(self._outgoing, self.peer(self.stage + 1))
            return received, self._outgoing
        return received, loss_fn(out, chunk) / self.plan.grad_accum

    def _sum_shared_gradients(self) -> None:
        """Sum the gradients of parameters that more than one stage used (a model that calls a
        block's submodule again in its head - diffusers' DiT reuses ``transformer_blocks[0]
        .norm1.emb`` - trains it on the first and the last stage): the stages' counts are
        all-reduced once per step over this replica's stages, then the gradients of the shared
        ones. With dp > 1 the gradients are then averaged over the stage's replicas (data
        parallel: each replica computed the mean loss of its share of the batch)."""
        params = list(self.module.parameters())
        used = torch.tensor([float(p.grad is not None) for p in params])
        dist.all_reduce(used, group=self.pp_group)
        for p, n in zip(params, used.tolist()):
            if n > 1:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=self.pp_group)
        if self.dp_group is not None:
            for p in params:
                if p.grad is not None:  # the same parameters on every replica of a stage
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad /= self.plan.dp

    def train_step(self, inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor]) -> float:
        """One GPipe step on ``inputs`` (every stage of a replica gets the replica's samples);
        returns the mean loss over the global batch."""
        m = self.plan.grad_accum
        last = self.stage == self.stages - 1
        chunks = [tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t, c)
                  for c in split_micro_batches(inputs, m)]
        saved = [self._forward(c, loss_fn) for c in chunks]
        total = torch.zeros((), device=self.device)
        for received, out in reversed(saved):
            if last:
                out.backward()
                total += out.detach()
            else:
                out.backward(_recv(self.peer(self.stage + 1), out.dtype, self.device))
            if received is not None:
                _send(received.grad, self.peer(self.stage - 1))
        self._sum_shared_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if last and self.dp_group is not None:
            dist.all_reduce(total, group=self.dp_group)
            total /= self.plan.dp
        dist.broadcast(total, src=self.peer(self.stages - 1), group=self.pp_group)
        return float(total)
