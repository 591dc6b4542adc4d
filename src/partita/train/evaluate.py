"""Held-out evaluation and the trainer's optional outputs (TensorBoard, torch.compile).

Evaluation (``--eval-data``, ``--eval-every N``, ``--eval-batches K``): the same K global
batches every time (sequences ``k * gbs ...`` of the eval set's seeded order, so successive
evaluations are comparable), forward only, through the parallel model as training runs it
(tensor parallel with the vocab-parallel loss, FSDP, pipeline stages via the schedule's
``eval``); the loss is the mean token cross-entropy over the K batches and the perplexity
its exponential (the usual LM definition, e.g. Megatron's ``evaluate_and_print_results``).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from ..errors import PartitaError


def _forward_loss(pm, x: torch.Tensor, y: torch.Tensor) -> float:
    """This rank's mean loss over its share of one batch, micro-batch by micro-batch."""
    from ..runtime.modules import logits
    from ..runtime.parallelize import cross_entropy
    model = pm.model
    core = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    total, chunks = 0.0, pm.plan.grad_accum
    for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):
        with loss_parallel() if pm.plan.tp > 1 else contextlib.nullcontext(), pm._autocast():
            out = logits(core, xs)
            loss = cross_entropy(getattr(out, "logits", out), ys)
        if isinstance(loss, DTensor):
            loss = loss.to_local()
        total += float(loss.float()) / chunks
    return total


def _pipeline_loss(pm, x: torch.Tensor, y: torch.Tensor) -> float:
    """The last stage's mean loss (summed over the pipeline group: the others add 0)."""
    from ..runtime.parallelize import _end
    losses: list[torch.Tensor] = []
    is_first = any(_end(mod, "tok_embeddings", "embed_tokens") for mod in pm.modules)
    is_last = any(_end(mod, "output", "lm_head") for mod in pm.modules)
    with loss_parallel() if pm.plan.tp > 1 else contextlib.nullcontext(), pm._autocast():  # pp with tp: vocab-sharded
        args = (x,) if is_first else ()
        pm.schedule.eval(*args, target=y if is_last else None, losses=losses if is_last else None)
    value = torch.tensor([sum(float(l.float()) for l in losses) / pm.plan.grad_accum], dtype=torch.float64)
    dist.all_reduce(value, group=pm.pp_group)
    return float(value.item())


@torch.no_grad()
def evaluate(pm, batches) -> float:
    """Mean loss over ``batches`` (this rank's (inputs, targets) of each global batch),
    averaged over the data-parallel ranks (equal token counts, so the mean of means)."""
    values = []
    for x, y in batches:
        if pm.cp_positions is not None:
            x, y = x[:, pm.cp_positions], y[:, pm.cp_positions]
        x, y = x.to(pm.device), y.to(pm.device)
        values.append(_pipeline_loss(pm, x, y) if pm.schedule is not None else _forward_loss(pm, x, y))
    local = torch.tensor([sum(values) / max(len(values), 1)], dtype=torch.float64)
    if pm.dp_group is not None and dist.get_world_size(pm.dp_group) > 1:
        dist.all_reduce(local, group=pm.dp_group)
        local /= dist.get_world_size(pm.dp_group)
    return float(local.item())


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
