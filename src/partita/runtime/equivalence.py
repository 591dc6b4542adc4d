"""Check a parallel run against single-process training of the same model and data.

Run under torchrun: every rank trains the plan with :func:`parallelize`, and also the
reference (one process, whole global batch split into the same micro-batches) - cheap for
the tiny models this is for - then compares the per-step losses and its own parameters
with the reference's. Used by the test-suite and by ``partita train --check``.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..models.llama import build_model
from ..plan import Plan
from .batches import dp_shard, synthetic_batch
from .modules import aux_loss, logits, vocab_size
from .parallelize import cross_entropy, parallelize


def make_model(name: str, seed: int):
    if name.startswith("hf-"):
        from ..models.hf import build_hf_model
        return build_hf_model(name, seed)
    return build_model(name, seed=seed)


def reference_run(model_name: str, plan: Plan, steps: int, seed: int, lr: float, max_grad_norm: float | None):
    """Single-process training: the loss of each (dp rank, micro-batch) chunk averaged, as
    the parallel run computes it (equal to the global mean for dense models)."""
    model = make_model(model_name, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = synthetic_batch(step, plan.gbs, plan.seq_len, vocab_size(model), seed)
        chunks = plan.dp * plan.grad_accum
        total = 0.0
        for xc, yc in zip(x.chunk(chunks), y.chunk(chunks)):
            loss = cross_entropy(logits(model, xc), yc) + aux_loss(model)
            (loss / chunks).backward()
            total += float(loss.detach()) / chunks
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, dict(model.named_parameters())


def run_case(model_name: str, plan_text: str, steps: int = 5, seed: int = 0, lr: float = 0.5,
             max_grad_norm: float | None = 1.0) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    plan = Plan.parse(plan_text, world_size=world, defaults={"dtype": "fp32"})
    model = make_model(model_name, seed)
    pm = parallelize(model, plan, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=lr), max_grad_norm=max_grad_norm)
    losses = []
    for step in range(steps):
        x, y = synthetic_batch(step, plan.gbs, plan.seq_len, vocab_size(model), seed)
        losses.append(pm.train_step(dp_shard(x, plan, rank), dp_shard(y, plan, rank)))
    ref_losses, ref_params = reference_run(model_name, plan, steps, seed, lr, max_grad_norm)
    loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses))
    param_diff = 0.0
    compared = 0
    for mod in pm.modules:
        for name, p in mod.named_parameters():
            name = name.removeprefix("module.")
            ref = ref_params[name]
            value = p.full_tensor() if isinstance(p, DTensor) else p
            value = value.detach().float().cpu()
            if getattr(p, "_partita_expert", False):
                ep_rank = dist.get_rank(pm.ep_group)
                n = value.shape[0]
                ref = ref[ep_rank * n:(ep_rank + 1) * n]
            param_diff = max(param_diff, float((value - ref.detach()).abs().max()))
            compared += 1
    out = torch.tensor([loss_diff, param_diff], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return {"plan": plan.summary(), "losses": losses, "reference": ref_losses, "loss_rel_diff": float(out[0]),
            "param_abs_diff": float(out[1]), "params_compared_rank0": compared}


def main() -> None:
    """``torchrun ... -m partita.runtime.equivalence OUT.json MODEL:PLAN [MODEL:PLAN ...]``"""
    out_path, cases = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    results = {}
    for case in cases:
        model_name, plan_text = case.split(":", 1)
        results[case] = run_case(model_name, plan_text)
        dist.barrier()
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
