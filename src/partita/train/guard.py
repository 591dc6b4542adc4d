"""The step guard: no optimizer update from a non-finite loss or gradient, and a stop
request (SIGINT / SIGTERM) agreed by every rank at the same step.

``ParallelModel.train_step`` runs forward, backward, clipping and the optimizer step in one
call, with no hook between the backward and the update, so the guard takes the place of
its ``_clip_and_step`` on the instance (and records the local loss from ``_accumulate`` /
``_pipeline_step``). What the runtime should expose instead - a pre-update hook or a
``train_step(..., skip_nonfinite=True)`` returning (loss, grad_norm, updated) - is in
docs/checkpoints.md ("Trainer side"). Per step the guard:

1. computes the global gradient norm (``pm.grad_norm()``, the same on every rank: the
   gradients are already reduced over dp and the norm over tp/pp/ep) even with clipping
   off - one more pass over the gradients than ``--max-grad-norm 0`` alone costs;
2. all-reduces (MAX) one small flag tensor over the world: [this rank's loss or the norm
   is non-finite, this rank received a stop signal] - so every rank takes the same branch
   at the same step (the local loss differs between dp ranks before its all-reduce);
3. non-finite: drops the gradients without an update (AdamW's step count is not
   advanced, as if the step had not happened); otherwise clips and steps as the runtime
   does.

With a gradient scaler (fp16) a non-finite gradient is the scaler's business (it skips the
update and lowers the scale, as designed); only a non-finite loss is counted then.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.distributed as dist

from . import faults


class StepGuard:
    """Installed on a :class:`~partita.runtime.parallelize.ParallelModel` by the worker;
    after each ``train_step``, ``nonfinite`` / ``stop`` say what the ranks agreed on."""

    def __init__(self, pm, rank: int):
        self.pm, self.rank = pm, rank
        self.step = -1
        self.local_loss = 0.0
        self.grad_norm = 0.0
        self.stop_signal = 0      # set by the worker's signal handler
        self.nonfinite = False    # agreed: this step's loss or gradient was not finite (no update)
        self.bad_loss = self.bad_norm = False  # agreed: which of the two (on some rank)
        self.stop = 0             # agreed: the signal number every rank stops for (0: none)
        for name in ("_accumulate", "_pipeline_step"):
            setattr(pm, name, self._recording(getattr(pm, name)))
        pm._clip_and_step = self._clip_and_step

    def _recording(self, original: Callable) -> Callable:
        def run(inputs, targets):
            local = original(inputs, targets)
            self.local_loss = faults.nan_loss(self.pm, self.rank, self.step, local)
            return self.local_loss
        return run

    def _agree(self, bad_loss: bool, bad_norm: bool) -> None:
        """One all-reduce (MAX) of [loss bad, norm bad, stop signal] over the world."""
        flags = torch.tensor([int(bad_loss), int(bad_norm), self.stop_signal], dtype=torch.int64,
                             device=self.pm.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        loss, norm, stop = flags.cpu().tolist()
        self.bad_loss, self.bad_norm, self.stop = bool(loss), bool(norm), int(stop)
        self.nonfinite = self.bad_loss or self.bad_norm

    def _clip_and_step(self) -> None:
        pm = self.pm
        if pm.scaler is not None:
            pm.scaler.unscale_(pm.optimizer)
        norm = pm.grad_norm()
        self.grad_norm = norm
        self._agree(not math.isfinite(self.local_loss), pm.scaler is None and not math.isfinite(norm))
        if self.nonfinite:
            pm.optimizer.zero_grad(set_to_none=True)
            return
        if pm.max_grad_norm:
            coef = pm.max_grad_norm / (norm + 1e-6)
            if coef < 1:
                grads = [p.grad for p in pm.parameters() if p.grad is not None]
                _scale(grads, coef)
        if pm.scaler is not None:
            pm.scaler.step(pm.optimizer)
            pm.scaler.update()
        else:
            pm.optimizer.step()
        pm.optimizer.zero_grad(set_to_none=True)

    def describe(self, loss: float) -> str:
        """What was not finite in this step, as every rank agreed; ``loss`` is the step's
        (all-reduced) loss, the norm's value is this rank's where it saw it."""
        parts = []
        if self.bad_loss:
            parts.append(f"loss {loss}")
        if self.bad_norm:
            parts.append(f"gradient norm {self.grad_norm}" if not math.isfinite(self.grad_norm)
                         else "gradient norm (on another rank)")
        return ", ".join(parts)


def _scale(grads: list[torch.Tensor], coef: float) -> None:
    """Multiply in place; foreach where the list is all-DTensor on one mesh or all plain."""
    from torch.distributed.tensor import DTensor
    kinds = {(type(g), id(g.device_mesh)) if isinstance(g, DTensor) else (type(g), None) for g in grads}
    if len(kinds) == 1:
        torch._foreach_mul_(grads, coef)
    else:
        for g in grads:
            g.mul_(coef)
