"""Check a parallel run against single-process training of the same model and data.

Run under torchrun: every rank trains the plan with :func:`parallelize`, and also the
reference (one process, whole global batch split into the same micro-batches) - cheap for
the tiny models this is for - then compares the per-step losses, its own parameters and
its own optimizer state (momentum buffers, Adam moments) with the reference's, shard by
shard: each rank checks exactly the slice of every tensor it holds. Used by the
test-suite and by ``partita train --check``.

A case is ``MODEL[@OPTIMIZER]:PLAN``; OPTIMIZER is ``momentum`` (SGD, momentum 0.9, the
default), ``sgd`` (no state) or ``adamw``.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from ..models.registry import build_named_model
from ..plan import Plan
from .batches import dp_shard, synthetic_batch
from .memory import held_gradient_bytes
from .modules import aux_loss, logits, vocab_size
from .parallelize import cross_entropy, parallelize, resolve_plan

#: optimizer name -> (factory of params, what its state holds per parameter)
OPTIMIZERS: dict[str, Callable[[list], torch.optim.Optimizer]] = {
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.5, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-6, foreach=False),
}


def make_model(name: str, seed: int):
    """The model of a case (any name of the registry, the tiny HF MoE models included)."""
    return build_named_model(name, seed)


def reference_run(model_name: str, plan: Plan, steps: int, seed: int, optimizer: str, max_grad_norm: float | None):
    """Single-process training: the loss of each (dp rank, micro-batch) chunk averaged, as
    the parallel run computes it (equal to the global mean for dense models). Returns the
    losses, the parameters and the optimizer state, both by parameter name."""
    model = make_model(model_name, seed)
    opt = OPTIMIZERS[optimizer](list(model.parameters()))
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
    params = dict(model.named_parameters())
    state = {name: opt.state[p] for name, p in params.items() if p in opt.state}
    return losses, params, state


#: reference runs already computed in this process, by everything :func:`reference_run` reads
_REFERENCES: dict[tuple, tuple] = {}


def _cached_reference(model_name: str, plan: Plan, steps: int, seed: int, optimizer: str,
                      max_grad_norm: float | None):
    """:func:`reference_run`, once per process for each distinct input: the reference reads
    only the global batch, the sequence length and the number of chunks (dp x accumulation)
    of the plan, so the many plans of one equivalence run share a handful of references
    (the results are only read, never modified)."""
    key = (model_name, plan.gbs, plan.seq_len, plan.dp * plan.grad_accum, steps, seed, optimizer, max_grad_norm)
    if key not in _REFERENCES:
        _REFERENCES[key] = reference_run(model_name, plan, steps, seed, optimizer, max_grad_norm)
    return _REFERENCES[key]


def _optimizer_state(optimizer, p: torch.Tensor) -> dict | None:
    """The state ``optimizer`` (possibly a combination of sharded optimizers) keeps for ``p``."""
    for part in getattr(optimizer, "parts", [optimizer]):
        inner = getattr(part, "optimizer", part)
        if inner is not None and p in getattr(inner, "state", {}):
            return inner.state[p]
    return None


def _my_slice(ref: torch.Tensor, held: torch.Tensor, pm, is_expert: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the part of the reference tensor ``ref`` this rank holds, that held part as a plain tensor).

    DTensors (tp, FSDP) are cut with their own placements and no communication
    (``distribute_tensor(..., src_data_rank=None)``: each rank takes its local chunk);
    experts are cut along dim 0 by the ep rank."""
    if is_expert:  # this ep rank's experts first (a DTensor's shape is that share's global shape)
        n = held.shape[0]
        r = dist.get_rank(pm.ep_group) if pm.ep_group is not None else 0
        ref = ref[r * n:(r + 1) * n]
    if isinstance(held, DTensor):
        mine = distribute_tensor(ref.detach().to(held.dtype), held.device_mesh, held.placements, src_data_rank=None)
        return mine.to_local(), held.to_local()
    return ref, held


def compare(pm, ref_params: dict, ref_state: dict) -> dict:
    """Largest absolute difference of this rank's parameters and optimizer state from the
    reference, and how much of the optimizer state it holds: per-parameter state elements
    (averaged over the state's tensors: momentum; Adam's two moments) over the model's
    parameter count - 1 unsharded, 1/dp with ZeRO-1/2/3 over dp ranks."""
    param_diff = state_diff = 0.0
    compared = state_compared = 0
    state_numel = 0.0
    for mod in pm.modules:
        for name, p in mod.named_parameters():
            name = name.removeprefix("module.")
            expert = getattr(p, "_partita_expert", False)
            ref, mine = _my_slice(ref_params[name], p, pm, expert)
            param_diff = max(param_diff, float((mine.detach().float().cpu() - ref.detach().float()).abs().max()))
            compared += 1
            state = _optimizer_state(pm.optimizer, p) or {}
            tensors = {k: v for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0}
            for key, value in tensors.items():
                ref_v, mine_v = _my_slice(ref_state[name][key], value, pm, expert)
                state_diff = max(state_diff, float((mine_v.float().cpu() - ref_v.float()).abs().max()))
                state_compared += 1
                state_numel += mine_v.numel() / len(tensors)
    total = sum(p.numel() for p in ref_params.values())
    return {"param_diff": param_diff, "state_diff": state_diff, "compared": compared,
            "state_compared": state_compared, "state_fraction": state_numel / total}


def run_case(case: str, steps: int = 5, seed: int = 0, max_grad_norm: float | None = 1.0) -> dict:
    model_part, plan_text = case.split(":", 1)
    model_name, _, optimizer = model_part.partition("@")
    optimizer = optimizer or "momentum"
    world = dist.get_world_size()
    model = make_model(model_name, seed)
    if plan_text.startswith("auto"):
        plan = resolve_plan(plan_text, model, world, "cpu")
    else:
        plan = Plan.parse(plan_text, world_size=world, defaults={"dtype": "fp32"})
    model_param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    pm = parallelize(model, plan, make_optimizer=OPTIMIZERS[optimizer], max_grad_norm=max_grad_norm)
    held: list[int] = []
    pm.micro_batch_hook = lambda i: held.append(held_gradient_bytes(pm.modules)) if i < plan.grad_accum - 1 else None
    losses = []
    for step in range(steps):
        x, y = synthetic_batch(step, plan.gbs, plan.seq_len, vocab_size(model), seed)
        losses.append(pm.train_step(dp_shard(x, plan, dist.get_rank()), dp_shard(y, plan, dist.get_rank())))
    ref_losses, ref_params, ref_state = _cached_reference(model_name, plan, steps, seed, optimizer, max_grad_norm)
    loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses))
    c = compare(pm, ref_params, ref_state)
    out = torch.tensor([loss_diff, c["param_diff"], c["state_diff"], max(held, default=0), c["state_fraction"]],
                       dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return {"plan": plan.summary(), "optimizer": optimizer, "losses": losses, "reference": ref_losses,
            "loss_rel_diff": float(out[0]), "param_abs_diff": float(out[1]), "state_abs_diff": float(out[2]),
            "params_compared_rank0": c["compared"], "state_compared_rank0": c["state_compared"],
            "state_fraction_max": float(out[4]), "grad_bytes_between_micro_batches_max": int(out[3]),
            "model_param_bytes": model_param_bytes, "dp": plan.dp, "grad_accum": plan.grad_accum}


def _load_worker(path: str) -> Callable[[str], dict]:
    """The ``shared_case(case)`` (else ``run_case(case)``) of the Python file ``path``: a
    test-suite worker that shares this process group (its cases skip a torchrun start-up of
    their own). Its result is rank 0's; JSON-serialisable."""
    import importlib.util
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, "shared_case", None) or module.run_case


#: the process group's timeout for one collective (and the start-up): long, because the
#: test-suite runs these ranks at nice 19 beside a loaded machine (load 15-50 on 2 cores), where
#: a starved rank can reach a collective minutes after its peers; a real hang is still bounded
#: by this and, below it, by the test-suite's watch of the torchrun (tests/conftest.py
#: CASE_STALL_S: no case finished in 1200 s)
GROUP_TIMEOUT_S = 1800


def _write_error(out_path: str, key: str) -> None:
    """Record that case ``key`` raised on this rank (its traceback) in ``OUT.rankR.error.json``,
    which the caller reads besides OUT's progress lines."""
    import traceback
    traceback.print_exc()
    path = f"{out_path}.rank{dist.get_rank()}.error.json"
    with open(path + ".tmp", "w") as f:
        json.dump({"case": key, "rank": dist.get_rank(), "error": traceback.format_exc()}, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    """``torchrun ... -m partita.runtime.equivalence OUT.json [--steps=N] CASE [CASE ...]``
    (5 steps unless ``--steps`` says otherwise; a ``--steps=N`` between cases applies to
    the cases after it, so one process group can serve cases of several step counts).

    ``--worker=FILE`` hands the cases after it to ``shared_case(case)`` or ``run_case(case)`` of the Python file FILE
    (``--worker=`` back to this module's): other test files' workers run their cases in the
    same process group, after this module's, and their results are keyed ``FILE::CASE``; a
    worker that writes files puts them in the folder named by ``PARTITA_WORKER_DIR`` (OUT's).

    Each finished case is appended to ``OUT.partial`` (one JSON line ``[key, result]``, by rank 0)
    as it ends, so the cases done survive a later one's failure. A case that raises on a rank
    writes ``OUT.rankR.error.json`` (the case and its traceback) and that rank exits at once
    with status 1: its peers may be inside a collective it will never enter (they would wait
    for the group's timeout, and a later case's collectives would pair with the wrong ones), so
    torchrun then ends the others, and the caller starts a fresh group for the cases after it
    (tests/conftest.py ``_run_equivalence``)."""
    out_path, args = sys.argv[1], sys.argv[2:]
    os.environ["PARTITA_WORKER_DIR"] = os.path.dirname(os.path.abspath(out_path))
    steps, worker, run_other = 5, "", None
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    results = {}
    for arg in args:
        if arg.startswith("--steps="):
            steps = int(arg.split("=", 1)[1])
            continue
        key = arg
        try:
            if arg.startswith("--worker="):
                worker = arg.split("=", 1)[1]
                run_other = _load_worker(worker) if worker else None
                continue
            key = f"{worker}::{arg}" if worker else arg
            results[key] = run_other(arg) if worker else run_case(arg, steps=steps)
            dist.barrier()
        except BaseException:  # this rank's stack, then out: the group may be out of step
            _write_error(out_path, key)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        if dist.get_rank() == 0:
            with open(out_path + ".partial", "a") as f:
                f.write(json.dumps([key, results[key]]) + "\n")
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
