"""Worker of tests/test_dualpipev_runtime.py, run in the session's shared equivalence torchrun
(tests/conftest.py, ``--worker`` of partita.runtime.equivalence). Per case (``MODEL:PLAN``):
``partita.parallelize`` the model, check what it built (torch's ScheduleDualPipeV class, the
virtual stages each rank holds), and compare the pipeline's forward-only ``eval_loss`` of one
batch with the same model's loss in this process alone (the mean over the micro-batches of
each micro-batch's mean token cross-entropy). Rank 0's result is returned."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleDualPipeV

from partita.plan import Plan
from partita.runtime.batches import synthetic_batch
from partita.runtime.equivalence import OPTIMIZERS, make_model
from partita.runtime.modules import logits, vocab_size
from partita.runtime.parallelize import cross_entropy, parallelize, virtual_stages_of_rank


def shared_case(case: str) -> dict:
    model_name, plan_text = case.split(":", 1)
    plan = Plan.parse(plan_text, world_size=dist.get_world_size(), defaults={"dtype": "fp32"})
    model = make_model(model_name, 0)
    x, y = synthetic_batch(7, plan.gbs, plan.seq_len, vocab_size(model), 0)
    with torch.no_grad():
        ref = sum(float(cross_entropy(logits(model, xc), yc)) for xc, yc in
                  zip(x.chunk(plan.grad_accum), y.chunk(plan.grad_accum))) / plan.grad_accum
    pm = parallelize(model, plan, make_optimizer=OPTIMIZERS["momentum"])
    got = pm.eval_loss(x, y)
    stages = [None] * dist.get_world_size()
    dist.all_gather_object(stages, virtual_stages_of_rank(plan))
    return {"torch_dualpipev": isinstance(pm.schedule, ScheduleDualPipeV), "stages_per_rank": stages,
            "eval_loss": got, "reference": ref}
