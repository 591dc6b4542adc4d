"""Overhead of `partita.parallelize` against the same layout written directly in PyTorch.

    python bench/runtime_overhead.py [--nproc 2] [--steps 12]

Both variants train the same model on the same batches in the same torchrun job,
alternating step by step (so machine noise hits both alike); the benchmark prints the
median step time of each and the ratio. Layout: FSDP2 (zero 3) over 2 ranks, gradient
accumulation 2, SGD, gradient clipping - what `--plan dp=2,zero=3` means.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta


def worker(steps: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from partita.models.llama import TransformerConfig, build_model
    from partita.plan import Plan
    from partita.runtime import parallelize
    from partita.train.data import dp_shard, synthetic_batch

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = TransformerConfig(vocab=1024, hidden=256, layers=4, heads=8, kv_heads=4, ffn_hidden=704, max_seq_len=256)
    plan = Plan(dp=world, zero=3, mbs=2, gbs=4 * world, seq_len=128, dtype="fp32")

    # A: partita
    pm = parallelize(build_model(cfg, seed=0), plan, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))

    # B: the same layout by hand
    model = build_model(cfg, seed=0)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def manual_step(x, y):
        m = plan.grad_accum
        for i, (xc, yc) in enumerate(zip(x.chunk(m), y.chunk(m))):
            model.set_requires_gradient_sync(i == m - 1)
            loss = F.cross_entropy(model(xc).flatten(0, 1), yc.flatten()) / m
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    times = {"partita": [], "manual": []}
    for step in range(steps):
        x, y = synthetic_batch(step, plan.gbs, plan.seq_len, cfg.vocab, 0)
        x, y = dp_shard(x, plan, rank), dp_shard(y, plan, rank)
        for name in (("partita", "manual") if step % 2 == 0 else ("manual", "partita")):
            dist.barrier()
            t0 = time.perf_counter()
            if name == "partita":
                pm.train_step(x, y)
            else:
                manual_step(x, y)
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    if rank == 0:
        warm = max(2, steps // 4)
        a, b = statistics.median(times["partita"][warm:]), statistics.median(times["manual"][warm:])
        print(f"layout: {plan.summary()}  model: {sum(p.numel() for p in build_model(cfg).parameters()) / 1e6:.1f}M params")
        print(f"median step  partita.parallelize: {a * 1e3:8.1f} ms   hand-written PyTorch: {b * 1e3:8.1f} ms   "
              f"ratio {a / b:.3f}")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        worker(args.steps)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           __file__, "--worker", "--steps", str(args.steps)]
    sys.exit(subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900).returncode)


if __name__ == "__main__":
    main()
