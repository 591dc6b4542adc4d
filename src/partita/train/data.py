"""Training data. Synthetic token batches, reproducible from a seed (the demo default)."""
from __future__ import annotations

import torch

from ..plan import Plan


def synthetic_batch(step: int, gbs: int, seq_len: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: (inputs, next-token targets), random tokens from ``seed``.
    Independent of the plan, so every plan sees the same data."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    data = torch.randint(0, vocab, (gbs, seq_len + 1), generator=g)
    return data[:, :-1], data[:, 1:]


def dp_shard(x: torch.Tensor, plan: Plan, rank: int) -> torch.Tensor:
    """This rank's contiguous share of the global batch (ranks of one dp replica share it)."""
    dp_index = (rank // (plan.cp * plan.tp)) % plan.dp
    per = plan.gbs // plan.dp
    return x[dp_index * per:(dp_index + 1) * per]
