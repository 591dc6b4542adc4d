"""Worker of tests/test_trace_runtime.py: every case in one process group. The suite runs
:func:`run_case` in the session's shared equivalence torchrun (tests/conftest.py, ``--worker``
of partita.runtime.equivalence); on its own:

    torchrun --nproc-per-node=2 tests/trace_runtime_worker.py OUT.json MODEL:PLAN ...

Per case: build the tiny model (examples/traced_models.py) from seed 0, train it under
``partita.parallelize`` for a few SGD steps on a fixed synthetic global batch (each rank
its slice), and train an identical copy in this process alone on the whole batch; rank 0
writes both loss curves and the largest parameter difference after training.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples import traced_models  # noqa: E402
from partita.plan import Plan  # noqa: E402
from partita.runtime.parallelize import parallelize  # noqa: E402

STEPS = 3
GLOBAL_BATCH = 4


def _global_inputs(name: str, step: int):
    torch.manual_seed(100 + step)
    _, inputs, *_ = getattr(traced_models, name)(batch=GLOBAL_BATCH)
    return inputs


def _loss(out, chunk) -> torch.Tensor:
    t = out.to_tuple()[0] if hasattr(out, "to_tuple") else out
    return (t.float() ** 2).mean()


def _slice(inputs, lo: int, hi: int):
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t[lo:hi] if isinstance(t, torch.Tensor) and t.dim() else t, inputs)


def _flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, given torch's own fused-attention formulas for the CPU flash
    kernel ``F.scaled_dot_product_attention`` runs here (its registry has none: it would count
    attention as 0)."""
    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *args, out_shape=None, **kwargs: sdpa_backward_flop_count(g, q, k, v)})


def _local(p: torch.Tensor) -> torch.Tensor:
    full = p.full_tensor() if hasattr(p, "full_tensor") else p
    return full.detach()


def run_case(case: str) -> dict:
    name, plan_text = case.split(":", 1)
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    # eval mode: no dropout anywhere (diffusers' DiT drops class labels at random in training
    # mode, for classifier-free guidance), so both sides compute the same function
    built = getattr(traced_models, name)(batch=2)
    model = built[0].eval()
    if len(built) > 2:
        model.partita_tp_plan = built[2]  # the example's TP plan (ViT)
    reference = copy.deepcopy(model)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    if plan_text.startswith("auto"):  # the search picks the plan from a trace of one example micro-batch
        model.partita_example_inputs = built[1]  # through the public entry point: partita.parallelize(model, "auto,...")
        pm = parallelize(model, plan_text + f",gbs={GLOBAL_BATCH}", make_optimizer=sgd, device_type="cpu")
        plan = pm.plan
    else:
        plan = Plan.parse(plan_text + f",gbs={GLOBAL_BATCH}", world)
        pm = parallelize(model, plan, make_optimizer=sgd, device_type="cpu")
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    # mesh order (pp, dp, cp, tp): tp and pp ranks of one dp replica see the same samples
    share, dp_rank = GLOBAL_BATCH // plan.dp, (rank // plan.tp) % plan.dp
    losses, ref_losses = [], []
    flops = 0.0
    for step in range(STEPS):
        inputs = _global_inputs(name, step)
        # the FLOPs this rank runs in one step (step 1: step 0 of a pipeline also builds its stage)
        with _flop_counter() if step == 1 else contextlib.nullcontext() as counter:
            losses.append(pm.train_step(_slice(inputs, dp_rank * share, (dp_rank + 1) * share), _loss))
        flops = float(counter.get_total_flops()) if step == 1 else flops
        out = reference(**inputs) if isinstance(inputs, dict) else reference(*inputs)
        loss = _loss(out, inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(float(loss))
    ref_params = dict(reference.named_parameters())
    # each rank compares the parameters it trains (all of them, except under pp: its stage's)
    diff, compared = 0.0, 0
    for n, p in pm.module.named_parameters():
        if not pm.optimizer.state.get(p):
            continue
        key = n.removeprefix("module.")
        diff = max(diff, float((_local(p) - ref_params[key].detach()).abs().max()))
        compared += 1
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in pm.module.parameters())
    stats = torch.tensor([diff, float(held), float(compared)])
    # what each rank really holds: its parameters' names and the elements of its local tensors
    mine = (rank // (plan.dp * plan.tp), sorted(n for n, _ in pm.module.named_parameters()), held, flops)
    every = [None] * world
    dist.all_gather_object(every, mine)
    stages = [{"names": sorted({n for s, names, _, _ in every if s == stage for n in names}),
               "numel": sum(h for s, _, h, _ in every if s == stage),
               "flops": [f for s, _, _, f in every if s == stage]} for stage in range(plan.pp)]
    dist.all_reduce(stats[:2], op=dist.ReduceOp.MAX)
    dist.all_reduce(stats[2:], op=dist.ReduceOp.SUM)
    return {"losses": losses, "reference": ref_losses, "param_abs_diff": float(stats[0]), "held": int(stats[1]),
            "compared": int(stats[2]) // (world // plan.pp), "params": len(ref_params), "units": len(pm.units),
            "plan": plan.summary(), "stages": stages}


def main() -> None:
    out, cases = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    results = {}
    try:
        for case in cases:
            results[case] = run_case(case)
    finally:
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(results, indent=1))
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
