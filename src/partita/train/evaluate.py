"""Held-out evaluation and the trainer's optional outputs (TensorBoard, torch.compile).

Evaluation (``--eval-data``, ``--eval-every N``, ``--eval-batches K``): the same K global
batches every time (sequences ``k * gbs ...`` of the eval set's seeded order, so successive
evaluations are comparable), forward only, through the parallel model as training runs it
(tensor parallel with the vocab-parallel loss, FSDP, pipeline stages via the schedule's
``eval``: ``ParallelModel.eval_loss``); the loss is the mean token cross-entropy over the K
batches - the language-model loss, without MoE load-balancing losses, on every layout - and
the perplexity its exponential (the usual LM definition, e.g. Megatron's
``evaluate_and_print_results``, which reports "lm loss" apart from the aux losses).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import PartitaError


@torch.no_grad()
def evaluate(pm, batches) -> float:
    """Mean loss over ``batches``: each this rank's (inputs, targets) of one global batch, or
    packed SFT rows' (inputs, targets, positions). Every batch's loss is the parallel model's
    forward-only :meth:`~partita.runtime.parallelize.ParallelModel.eval_loss` (already the
    mean over data-parallel ranks; the language-model loss, no MoE aux loss)."""
    values = [pm.eval_loss(*batch) for batch in batches]
    return sum(values) / max(len(values), 1)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


class TensorBoard:
    """Rank 0's TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: str | None, enabled: bool):
        self.writer = None
        if log_dir and enabled:
            self.writer = summary_writer(log_dir)

    def scalars(self, step: int, values: dict) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
        return True
    except ImportError:
        return False


def summary_writer(log_dir: str):
    if not tensorboard_available():
        raise PartitaError("--tensorboard needs the tensorboard package: pip install 'partita[tensorboard]'")
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(log_dir=log_dir)


def compile_blocks(pm) -> int:
    """``torch.compile`` each transformer block in place (``nn.Module.compile`` keeps the
    parameter names, so checkpoints and --save-hf are unchanged); returns how many."""
    count = 0
    for module in pm.modules:
        core = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
        layers = getattr(core, "layers", None) or getattr(getattr(core, "model", None), "layers", None)
        blocks = layers.values() if isinstance(layers, nn.ModuleDict) else (layers or [])
        for block in blocks:
            block.compile()
            count += 1
    return count
