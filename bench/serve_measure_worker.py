"""One rank of ``bench/serve_vs_measure.py --nproc 2``: forward-only prefill and decode steps of
the bench's tiny Llama on two gloo processes, under Partita's runtime.

    torchrun --nproc-per-node 2 bench/serve_measure_worker.py --mode tp --out /tmp/x.json

* ``--mode tp``: one replica over both ranks, tensor parallel by
  :func:`partita.runtime.tensor_parallel.apply_tp_hf` (Megatron layout: column-parallel
  q/k/v/gate/up, row-parallel o/down - two all-reduces per layer - and a vocab-parallel
  head); transformers' DynamicCache holds each rank's half of the kv heads;
* ``--mode dp``: two replicas, each rank its own model and sequences (nothing shared but the
  machine's cores and memory bandwidth).

Every timed call starts after a barrier. A rank's time is read on the busy clock ``partita
calibrate`` times every rate with (:func:`partita.calibrate.busy_clock.busy_call`: the
wall-clock minus the time the thread waited on the run queue, ``/proc/thread-self/schedstat``
field 2): on a machine other processes share, what is left is the time the forward ran or
waited on its peer. A tp step's time is read as calibrate reads its collectives
(:func:`partita.calibrate.busy_clock.critical_busy_s` of both ranks' ``[wall, run, wait]``, the
ranks' run share over all the case's repeats): a rank's own busy clock still holds the time it
slept through the peer's queueing at each all-reduce (issue 37: tp2 decode batch 1 read 48-98 ms
between runs on it); ``busy_min_s`` keeps that earlier figure, the smaller of the two ranks'. A
dp step's time is the smaller of the two ranks' busy clocks (no collective inside the step).
The raw wall-clock is the larger of the two; medians over the repeats. Each step also records the thread's minor page faults (``getrusage``
``RUSAGE_THREAD``, ``ru_minflt``; the larger of the ranks'): pages the step touched for the
first time, beside what the serve model prices as first-touched. Rank 0 writes
the cases as JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys

import torch
import torch.distributed as dist
from transformers import DynamicCache

from partita.calibrate.busy_clock import critical_busy_s, mark, since

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_vs_measure import CONFIG, build_model, case_list, steady_heap  # noqa: E402


def timed(fn) -> tuple[float, float, int, list[float]]:
    """(busy seconds, wall seconds, minor page faults, ``[wall, run, wait]``) of one call of
    ``fn`` after a barrier; busy = wall less the run-queue wait (the thread's busy clock)."""
    if dist.is_initialized():
        dist.barrier()
    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    start = mark()
    fn()
    interval = since(start)
    return interval[0] - interval[2], interval[0], resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0, interval


def combine(both: list, tp: bool) -> tuple[float, float, float, float]:
    """(step seconds, the smaller rank's busy seconds, wall, faults), medians over the repeats
    of every rank's :func:`timed` records (module docstring)."""
    n = len(both[0])
    busy_min = statistics.median(min(r[i][0] for r in both) for i in range(n))
    if tp:
        window = [[sum(r[i][3][j] for i in range(n)) for j in range(3)] for r in both]
        step = statistics.median(critical_busy_s([r[i][3] for r in both], window) for i in range(n))
    else:
        step = busy_min
    return (step, busy_min, statistics.median(max(r[i][1] for r in both) for i in range(n)),
            statistics.median(max(r[i][2] for r in both) for i in range(n)))


def _ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def measure_case(model, kind: str, a: int, b: int, repeats: int, seed: int) -> list[tuple[float, float, int]]:
    """Per repeat (busy, wall, minor faults) of a prefill of ``a`` tokens (``kind == 'prefill'``) or a decode
    step of ``a`` sequences at context ``b`` (cache growing by one token a step); one warm-up."""
    out = []
    with torch.no_grad():
        if kind == "prefill":
            ids = _ids(1, a, seed)
            for i in range(repeats + 1):
                t = timed(lambda: model(input_ids=ids, cache=DynamicCache(config=model.config), use_cache=True,
                                        logits_to_keep=1))
                out += [t] if i else []
            return out
        cache = DynamicCache(config=model.config)
        model(input_ids=_ids(a, b, seed), cache=cache, use_cache=True, logits_to_keep=1)
        step = _ids(a, 1, seed + 1)
        for i in range(repeats + 1):
            t = timed(lambda: model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1))
            out += [t] if i else []
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("tp", "dp"), required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout-s", type=float, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    steady_heap()  # pages reused after the warm-up step, as an engine's (serve_vs_measure.steady_heap)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    try:
        model = build_model()
        if args.mode == "tp":
            from torch.distributed.device_mesh import init_device_mesh
            from partita.runtime.tensor_parallel import apply_tp_hf
            apply_tp_hf(model, init_device_mesh("cpu", (dist.get_world_size(),)))
        rows = []
        for kind, a, b in case_list():
            seed = a * 7 + b + (rank if args.mode == "dp" else 0)  # dp: each replica its own tokens
            local = measure_case(model, kind, a, b, args.repeats, seed)
            both: list = [None] * dist.get_world_size()
            dist.all_gather_object(both, local)
            busy, busy_min, wall, faults = combine(both, args.mode == "tp")
            rows.append({"kind": kind, "a": a, "b": b, "busy_s": busy, "busy_min_s": busy_min, "wall_s": wall,
                         "faults": faults})
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump({"mode": args.mode, "world": dist.get_world_size(), "rows": rows,
                           "load": os.getloadavg()[0]}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
