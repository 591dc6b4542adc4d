"""Bounded memo tables for the cost model's per-shape terms.

The search evaluates thousands of plans that share layer shapes; each term depends on
the model, the device and a frozen shape (:mod:`.shape`) only, so it is computed once
per distinct argument. :func:`memoised` makes the arguments themselves the key, so a
formula cannot depend on something its key misses."""
from __future__ import annotations

import functools
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


def memoised(fn: Callable[..., T]) -> Callable[..., T]:
    """Memoise ``fn(model, device, *shapes)`` or ``fn(model, *shapes)``: the key is every
    argument, with the model and the device (a second parameter named ``device``)
    replaced by their content keys (``cache_key``: equal content shares entries; an
    object id could be reused after it is freed). Every other argument must be hashable
    and immutable (a frozen shape, a str, a bool)."""
    table = Memo()
    values = table.values
    with_device = fn.__code__.co_varnames[1:2] == ("device",)

    def compute(key: tuple, args: tuple) -> T:
        if len(values) >= table.limit:
            values.clear()
        value = values[key] = fn(*args)
        return value

    if with_device:
        def wrapper(model, device, *args):
            key = (model.cache_key, device.cache_key, *args)
            value = values.get(key)
            return compute(key, (model, device, *args)) if value is None else value
    else:
        def wrapper(model, *args):  # type: ignore[misc]
            key = (model.cache_key, *args)
            value = values.get(key)
            return compute(key, (model, *args)) if value is None else value

    functools.update_wrapper(wrapper, fn)
    wrapper.memo = table  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
