"""One training process (started by torchrun; see launch.py). Prints one line per step on rank 0."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import PartitaError
from ..models.llama import build_model
from ..plan import Plan
from ..runtime.device import backend_for, detect_device_type
from ..runtime.parallelize import parallelize
from .data import dp_shard, synthetic_batch


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--plan", required=True, help="plan JSON (written by the launcher)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--device")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout-s", type=int, default=300)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device_type = detect_device_type(args.device)
    dist.init_process_group(backend_for(device_type), timeout=timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    code = 0
    try:
        plan = Plan.load(args.plan)
        model = build_model(args.model, seed=args.seed)
        if args.optimizer == "sgd":
            make_opt = lambda ps: torch.optim.SGD(ps, lr=args.lr)  # noqa: E731
        else:
            make_opt = lambda ps: torch.optim.AdamW(ps, lr=args.lr, foreach=False)  # noqa: E731
        pm = parallelize(model, plan, make_optimizer=make_opt, device_type=device_type,
                         max_grad_norm=args.max_grad_norm or None)
        vocab = model.cfg.vocab
        for step in range(args.steps):
            t0 = time.perf_counter()
            x, y = synthetic_batch(step, plan.gbs, plan.seq_len, vocab, args.seed)
            if os.environ.get("PARTITA_CRASH_RANK") == str(rank) and step == 1:  # fault injection for tests
                raise RuntimeError(f"injected crash on rank {rank}")
            loss = pm.train_step(dp_shard(x, plan, rank), dp_shard(y, plan, rank))
            dt = time.perf_counter() - t0
            if rank == 0:
                record = {"step": step, "loss": loss, "step_time_s": dt,
                          "tokens_per_s": plan.tokens_per_step / dt}
                print(json.dumps(record) if args.json else
                      f"step {step:5d}  loss {loss:.6f}  {dt * 1e3:8.1f} ms  {record['tokens_per_s']:,.0f} tokens/s",
                      flush=True)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr, flush=True)
        code = 2
    if code == 0:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
