"""The step guard: no optimizer update from a non-finite loss or gradient, and a stop
request (SIGINT / SIGTERM) agreed by every rank at the same step.

It is the runtime's ``ParallelModel.update_gate``: ``train_step`` calls it after the
gradients are reduced (and unscaled) and before clipping and the optimizer step, with this
rank's loss and the global gradient norm. Per step the guard:

1. receives the global gradient norm (``pm.grad_norm()``, the same on every rank: the
   gradients are already reduced over dp and the norm over tp/pp/ep), which the runtime
   computes even with clipping off once a gate is set - one more pass over the gradients
   than ``--max-grad-norm 0`` alone costs;
2. all-reduces (MAX) one small flag tensor over the world: [this rank's loss or the norm
   is non-finite, this rank received a stop signal] - so every rank takes the same branch
   at the same step (the local loss differs between dp ranks before its all-reduce);
3. non-finite: tells the runtime to drop the gradients without an update (AdamW's step
   count is not advanced, as if the step had not happened); otherwise the runtime clips
   and steps as always.

With a gradient scaler (fp16) a non-finite gradient is the scaler's business (it skips the
update and lowers the scale, as designed); only a non-finite loss is counted then.
"""
from __future__ import annotations

import math
import torch
import torch.distributed as dist

from . import faults


class StepGuard:
    """Installed on a :class:`~partita.runtime.parallelize.ParallelModel` by the worker;
    after each ``train_step``, ``nonfinite`` / ``stop`` say what the ranks agreed on."""

    def __init__(self, pm, rank: int):
        self.pm, self.rank = pm, rank
        self.step = -1
        self.grad_norm = 0.0
        self.stop_signal = 0      # set by the worker's signal handler
        self.nonfinite = False    # agreed: this step's loss or gradient was not finite (no update)
        self.bad_loss = self.bad_norm = False  # agreed: which of the two (on some rank)
        self.stop = 0             # agreed: the signal number every rank stops for (0: none)
        pm.update_gate = self.gate
        faults.inject_nan(pm, rank, lambda: self.step)

    def _agree(self, bad_loss: bool, bad_norm: bool) -> None:
        """One all-reduce (MAX) of [loss bad, norm bad, stop signal] over the world."""
        flags = torch.tensor([int(bad_loss), int(bad_norm), self.stop_signal], dtype=torch.int64,
                             device=self.pm.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        loss, norm, stop = flags.cpu().tolist()
        self.bad_loss, self.bad_norm, self.stop = bool(loss), bool(norm), int(stop)
        self.nonfinite = self.bad_loss or self.bad_norm

    def gate(self, local: float, norm: float) -> bool:
        """The runtime's update gate: agree with every rank whether this step updates."""
        self.grad_norm = norm
        self._agree(not math.isfinite(local), self.pm.scaler is None and not math.isfinite(norm))
        return not self.nonfinite

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

