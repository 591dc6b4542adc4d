"""A bounded memo table for the cost model's per-shape terms.

The search evaluates thousands of plans that share layer shapes; these terms depend on
a handful of plan fields only, so each is computed once per distinct key."""
from __future__ import annotations

from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class Memo:
    """``get(key, compute)``: the cached value, computed on first use; cleared when it grows past ``limit``."""

    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self.values: dict[Hashable, object] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        value = self.values.get(key)
        if value is None:
            if len(self.values) >= self.limit:
                self.values.clear()
            value = self.values[key] = compute()
        return value  # type: ignore[return-value]
