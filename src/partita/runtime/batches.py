"""The global batch of a step and each data-parallel rank's share of it.

These live on the runtime side because the runtime's own equivalence check needs them
(and ``train/`` may depend on ``runtime/``, never the reverse); ``train/data.py``
re-exports them for the training loop.
"""
from __future__ import annotations

import torch

from ..plan import Plan, axis_index


def synthetic_batch(step: int, gbs: int, seq_len: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: (inputs, next-token targets), random tokens from ``seed``.
    Independent of the plan, so every plan sees the same data."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    data = torch.randint(0, vocab, (gbs, seq_len + 1), generator=g)
    return data[:, :-1], data[:, 1:]


def dp_index(plan: Plan, rank: int) -> int:
    """This rank's coordinate on the data-parallel axis (which share of the batch it reads)."""
    return axis_index(plan, "dp", rank)


def dp_shard(x: torch.Tensor, plan: Plan, rank: int) -> torch.Tensor:
    """This rank's contiguous share of the global batch (ranks of one dp replica share it)."""
    per = plan.gbs // plan.dp
    i = dp_index(plan, rank)
    return x[i * per:(i + 1) * per]
