"""GradientSync's flatten into a buffer kept between steps vs a fresh ``torch.cat`` each step.

    python bench/gradient_sync.py [--model small-llama] [--steps 20]

Two gloo processes each hold the gradients of ``--model`` (Partita's reference transformer,
random values) and average them over the pair with
:class:`partita.runtime.data_parallel.GradientSync`, the data-parallel gradient average the
runtime uses without DDP (ZeRO-1, and tensor/expert parallel layouts); beside it, in the same
processes and on the same gradients, the flatten it replaced: a fresh fp32 buffer from
``torch.cat`` each step, all-reduce, divide, copy back. Prints the median seconds per sync of
each and their ratio, and checks both give the same averaged gradients bit for bit.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _fresh_cat_sync(grads: list[torch.Tensor]) -> None:
    """The flatten before 2026-12-05: a new fp32 buffer every call."""
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _worker(rank: int, port: int, model: str, steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    from partita.models.llama import build_model
    from partita.runtime.data_parallel import GradientSync
    params = list(build_model(model).parameters())
    sync = GradientSync(params, dist.group.WORLD, None)
    times: dict[str, list[float]] = {"fresh torch.cat": [], "kept buffer": []}
    results = {}
    for step in range(steps + 2):  # two warm-up rounds
        for name in times:
            gen = torch.Generator().manual_seed(1000 * step + rank)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            dist.barrier()
            start = time.perf_counter()
            sync() if name == "kept buffer" else _fresh_cat_sync([p.grad for p in params])
            elapsed = time.perf_counter() - start
            if step >= 2:
                times[name].append(elapsed)
            results[name] = torch.cat([p.grad.reshape(-1) for p in params])
    same = torch.equal(results["fresh torch.cat"], results["kept buffer"])
    queue.put((rank, {k: statistics.median(v) for k, v in times.items()}, same,
               sum(p.numel() for p in params)))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-llama")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, args.model, args.steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = sorted(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    params = out[0][3]
    print(f"{args.model}: {params / 1e6:.1f} M parameters, dp=2 on gloo, median of {args.steps} syncs per rank")
    print(f"{'rank':>4} {'fresh torch.cat ms':>19} {'kept buffer ms':>15} {'ratio':>6}  same result")
    for rank, medians, same, _ in out:
        old, new = medians["fresh torch.cat"], medians["kept buffer"]
        print(f"{rank:>4} {old * 1e3:>19.1f} {new * 1e3:>15.1f} {old / new:>6.2f}  {same}")


if __name__ == "__main__":
    main()
