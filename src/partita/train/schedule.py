"""Learning-rate schedule: linear warm-up then cosine decay to ``min_lr`` (GPT-3 / LLaMA recipe)."""
from __future__ import annotations

import math


def lr_at(step: int, base_lr: float, warmup: int, total: int, min_lr: float = 0.0, kind: str = "cosine") -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if kind == "constant":
        return base_lr
    if warmup and step < warmup:
        return base_lr * (step + 1) / warmup
    if total <= warmup:
        return base_lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * progress))
