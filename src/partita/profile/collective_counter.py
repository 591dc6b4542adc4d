"""Data-parallel bytes as they really leave each rank: every collective call counted with
the tensors handed to the backend (``partita profile``, issue 17).

Why not the profiler trace: on gloo, the collectives that torch's ``powerSGD_hook`` launches
from future callbacks (its P and Q all-reduces) run on gloo's threads without the
profiler's thread state and never appear in the trace, and c10d records no message sizes
(``record_param_comms``) for gloo. So under ``partita profile`` the worker wraps
``torch.distributed``'s Python collectives (:data:`COLLECTIVES`) for the run: each call adds
the bytes of its input tensors (``numel x element_size``, the buffer size nccl-tests and
the cost model's :func:`partita.cost.memory.dp_gradient_bytes` count), its process group's
ranks and its launch-to-completion interval (async calls complete when their future does).
Torch's hooks (``powerSGD_hook``, ``default_hooks``), FSDP2 and Partita's bucketed
``GradientSync`` all call ``torch.distributed.<op>`` by attribute at call time, so they are
seen. DDP's built-in reduction is C++ and is not: :func:`route_builtin_ddp_reduction`
gives a hook-less DDP torch's ``allreduce_hook`` while profiling (the same bucket, the
same sum; it divides by the group size before the all-reduce instead of after).

Known gaps: collectives launched from C++ elsewhere (pipeline send/recv inside torch's
schedules use the Python API too; DTensor's functional collectives do not and are not
counted - they are tensor-parallel, not data-parallel traffic).
"""
from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

#: the Python collectives wrapped while counting (those that exist in this torch)
COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce_scatter", "all_gather",
               "broadcast", "all_to_all_single", "all_gather_single", "reduce_scatter_single")
#: the name a report uses for each wrapped function (as :mod:`partita.analyze.breakdown` names kinds)
KIND = {"all_reduce": "all_reduce", "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter": "reduce_scatter",
        "reduce_scatter_single": "reduce_scatter", "all_gather_into_tensor": "all_gather",
        "all_gather": "all_gather", "all_gather_single": "all_gather", "broadcast": "broadcast",
        "all_to_all_single": "all_to_all"}
#: the argument holding the sent tensor(s), by position and name, per wrapped function
SENT = {"all_reduce": (0, "tensor"), "reduce_scatter_tensor": (1, "input"), "reduce_scatter": (1, "input_list"),
        "reduce_scatter_single": (1, "input"), "all_gather_into_tensor": (1, "input_tensor"),
        "all_gather": (1, "tensor"), "all_gather_single": (1, "input_tensor"), "broadcast": (0, "tensor"),
        "all_to_all_single": (1, "input")}


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class CollectiveCounter:
    """Counts bytes, calls and time of every wrapped collective, per step and group.

    ``start()`` wraps the functions, ``set_step(n)`` files later calls under step ``n``,
    ``stop()`` restores them. Thread-safe: PowerSGD's callbacks count from gloo's threads."""

    def __init__(self) -> None:
        self.step = -1
        self.lock = threading.Lock()
        #: (step, kind, group ranks) -> {"bytes", "calls", "intervals"}
        self.records: dict[tuple[int, str, tuple[int, ...]], dict] = {}
        self.saved: dict[str, Callable] = {}

    def start(self) -> "CollectiveCounter":
        for name in COLLECTIVES:
            if hasattr(dist, name) and name not in self.saved:
                self.saved[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self.saved[name]))
        return self

    def stop(self) -> None:
        for name, fn in self.saved.items():
            setattr(dist, name, fn)
        self.saved = {}

    def set_step(self, step: int) -> None:
        self.step = step

    def _wrap(self, name: str, fn: Callable) -> Callable:
        pos, key = SENT[name]
        signature = inspect.signature(fn)

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:  # group / async_op may come by position too
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = kwargs
            sent = bound.get(key, args[pos] if len(args) > pos else None)
            group = bound.get("group", None)
            ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
            t0, step = time.perf_counter(), self.step
            work = fn(*args, **kwargs)
            if work is not None and bound.get("async_op", False):
                work.get_future().then(lambda fut: self._add(step, name, ranks, sent, t0))
            else:
                self._add(step, name, ranks, sent, t0)
            return work

        counted.__wrapped__ = fn  # type: ignore[attr-defined]
        return counted

    def _add(self, step: int, name: str, ranks: tuple[int, ...], sent: Any, t0: float) -> None:
        t1 = time.perf_counter()
        with self.lock:
            entry = self.records.setdefault((step, KIND[name], ranks), {"bytes": 0, "calls": 0, "intervals": []})
            entry["bytes"] += _nbytes(sent)
            entry["calls"] += 1
            entry["intervals"].append((t0, t1))

    def per_step(self, ranks: tuple[int, ...], first_step: int) -> dict[str, dict[str, float]]:
        """Mean bytes, calls and seconds (union of the calls' intervals) per step, by
        collective, of the group with exactly these ranks, over steps >= ``first_step``."""
        with self.lock:
            rows = {k: v for k, v in self.records.items() if k[2] == tuple(ranks) and k[0] >= first_step}
            steps = sorted({k[0] for k in self.records if k[0] >= first_step})
        out: dict[str, dict[str, float]] = {}
        for (_, kind, _), v in rows.items():
            e = out.setdefault(kind, {"bytes": 0.0, "calls": 0.0, "seconds": 0.0})
            e["bytes"] += v["bytes"]
            e["calls"] += v["calls"]
            e["seconds"] += _union_length(v["intervals"])
        n = max(len(steps), 1)
        return {k: {f: x / n for f, x in e.items()} | {"steps": len(steps)} for k, e in sorted(out.items())}


def route_builtin_ddp_reduction(modules: list) -> bool:
    """Give a DDP without a comm hook torch's ``allreduce_hook`` (module docstring: its
    C++ reduction would not be counted); True when it did."""
    ddp = modules[0] if modules and isinstance(modules[0], torch.nn.parallel.DistributedDataParallel) else None
    if ddp is None or getattr(ddp, "_comm_hooks", None):
        return False
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp.register_comm_hook(ddp.process_group, default_hooks.allreduce_hook)
    return True
