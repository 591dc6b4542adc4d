"""``parallelize(model, plan)`` for any model: the traced path (issue 19, item 3).

A model that is neither Partita's reference transformer nor an HF causal LM (a ViT, a
diffusion UNet, a DiT, ...) is parallelised along its *repeated blocks*, found as the
trace finds them (:func:`partita.tracing.blocks.find_blocks`: every instance of the
class of the longest run of identical children). Order, as torchtitan applies it:

1. activation checkpointing per block (``recompute=full``): the block's forward runs
   under non-reentrant ``torch.utils.checkpoint`` - it keeps its inputs, recomputes the
   rest in backward [Chen et al. 2016];
2. data parallel: zero 3 - FSDP2 ``fully_shard`` on every block, then the root
   (parameters gathered per block, resharded after forward); zero 1/2 - the same without
   resharding after forward (gradients and optimizer states sharded, which covers ZeRO-1's
   saving); zero 0 - DDP (``DistributedDataParallel``) [Zhao et al. 2023, PyTorch FSDP];
3. the optimizer over the (sharded) parameters.

Tensor parallel (``tp``) applies the model's TP plan to every block (:func:`apply_tp_plan`)
before the rest (:func:`shard_blocks` applies the three); pipeline parallel (``pp``) splits a
block-sequence forward over ranks and applies the same to each stage's blocks
(:mod:`.traced_pipeline`), with tp and any zero level. Not for traced models: context and
expert parallel.
"""
from __future__ import annotations

import fnmatch
import functools
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.checkpoint import checkpoint

from ..errors import PartitaError
from ..plan import Plan
from ..tracing.blocks import find_blocks
from .device import detect_device_type, local_device
from .traced_pipeline import TracedPipeline, split_micro_batches

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def is_traced_model(model: nn.Module) -> bool:
    """Whether ``parallelize`` takes the traced path: not a reference transformer (``.layers``)
    nor an HF causal LM (``.model.layers``)."""
    return not hasattr(model, "layers") and not hasattr(getattr(model, "model", None), "layers")


def traced_units(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP wraps and checkpointing recomputes, in module order."""
    return [model.get_submodule(p) for p in _unit_paths(model)]


def _unit_paths(model: nn.Module) -> tuple[str, ...]:
    layout = find_blocks(model)
    if not layout.units:
        raise PartitaError(f"{type(model).__name__} has no repeated blocks (no run of 2+ identical children in a "
                           "ModuleList/Sequential/ModuleDict): FSDP units and recompute need them")
    return layout.units


def _style(kind: str):
    """A DTensor parallel style from a transformers-style name: ``colwise`` (output features
    split, output left sharded for a following ``rowwise``), ``rowwise`` (input features split,
    output all-reduced) [Shoeybi et al. 2019]; ``_rep`` (``colwise_rep``: the output gathered
    to every rank, for a head whose output leaves the model; ``rowwise_rep``: a replicated
    input split locally), as transformers' ``ParallelInterface`` names them. None: not a style."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    kind = str(kind).lower()
    if "colwise" in kind:
        return ColwiseParallel(output_layouts=Replicate() if "rep" in kind else Shard(-1))
    if "rowwise" in kind:
        return RowwiseParallel(input_layouts=Replicate() if "rep" in kind else Shard(-1))
    return None


def apply_tp_plan(model: nn.Module, tp_plan: dict[str, str], tp_mesh, units: tuple[str, ...] | None = None) -> int:
    """Megatron-style tensor parallel from a transformers/torchtitan-style ``tp_plan``
    (:func:`_style`): in every block, patterns on full paths or relative to the block, as
    :func:`partita.trace` reads them; outside the blocks (a stem or head), patterns on full
    paths. ``units``: the block paths (default: the model's repeated blocks; a pipeline stage
    passes the whole model's, some of them emptied). Returns the number of layers split."""
    from torch.distributed.tensor.parallel import parallelize_module
    count = 0
    units = units or _unit_paths(model)
    for path in units:
        unit = model.get_submodule(path)
        styles = {}
        for rel, _ in unit.named_modules():
            for pattern, kind in tp_plan.items():
                if rel and (fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(f"{path}.{rel}", pattern)):
                    styles[rel] = _style(kind) or styles.get(rel)
        styles = {k: v for k, v in styles.items() if v is not None}
        if styles:
            parallelize_module(unit, tp_mesh, styles)
            count += len(styles)
    outside = {p: _style(kind) for p, _ in model.named_modules() for pattern, kind in tp_plan.items()
               if p and not any(p == u or p.startswith(u + ".") for u in units) and fnmatch.fnmatchcase(p, pattern)}
    outside = {k: v for k, v in outside.items() if v is not None}
    if outside:
        parallelize_module(model, tp_mesh, outside)
        count += len(outside)
    if not count:
        raise PartitaError(f"the TP plan names no layer of {type(model).__name__} ({', '.join(tp_plan)})")
    return count


def _check(plan: Plan) -> None:
    errs = []
    if plan.cp > 1 or plan.ep > 1:
        errs.append(f"traced models run dp with zero 0-3, tp (with a TP plan), pp and recompute in this runtime, "
                    f"not cp={plan.cp}/ep={plan.ep}")
    if plan.recompute == "selective":
        errs.append("traced models recompute whole blocks: use recompute=full (or none)")
    if plan.dtype == "fp8":
        errs.append("fp8 training is not implemented by the runtime; use bf16")
    if errs:
        raise PartitaError("; ".join(errs))


def apply_block_recompute(units: list[nn.Module]) -> None:
    """Checkpoint every unit's forward (non-reentrant, keyword arguments passed through)."""
    for unit in units:
        forward = unit.forward

        @functools.wraps(forward)
        def wrapped(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        unit.forward = wrapped


def gather_on_outside_use(units: list[nn.Module]) -> None:
    """Gather a sharded unit again when the model calls one of its submodules outside the
    unit's own forward (diffusers' DiT reuses ``transformer_blocks[0].norm1.emb`` for the
    final modulation, after block 0 has run and been resharded). The unit stays gathered
    until its backward, where FSDP2 reduce-scatters the gradients of both uses."""
    active: set[int] = set()
    for unit in units:
        unit.register_forward_pre_hook(lambda mod, args: active.add(id(mod)))
        unit.register_forward_hook(lambda mod, args, out: active.discard(id(mod)))
        for sub in unit.modules():
            if sub is not unit and any(True for _ in sub.parameters(recurse=False)):
                sub.register_forward_pre_hook(
                    lambda mod, args, unit=unit: None if id(unit) in active else unit.unshard())


class TracedParallel:
    """A parallelised traced model and its optimizer; :meth:`train_step` runs one step."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan, units: list[nn.Module],
                 device: torch.device):
        self.module, self.optimizer, self.plan, self.units, self.device = module, optimizer, plan, units, device

    def train_step(self, inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor]) -> float:
        """One optimizer step on this rank's ``inputs`` (``grad_accum x mbs`` samples along dim 0
        of every tensor; a tuple of positional or a dict of keyword inputs). ``loss_fn(output,
        micro_batch_inputs)`` returns the mean loss of a micro-batch; the returned loss is the
        mean over the global batch (all dp ranks)."""
        m = self.plan.grad_accum
        device = self.device
        total = torch.zeros((), device=device)
        for chunk in split_micro_batches(inputs, m):
            chunk = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, chunk)
            out = self.module(**chunk) if isinstance(chunk, dict) else self.module(*chunk)
            loss = loss_fn(out, chunk) / m
            loss.backward()
            total += loss.detach()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if dist.is_initialized() and self.plan.dp > 1:
            dist.all_reduce(total)
            total /= self.plan.dp
        return float(total)


def parallelize_traced(model: nn.Module, plan: Plan | str,
                       make_optimizer: Callable[[list], torch.optim.Optimizer] | None = None,
                       device_type: str | None = None, tp_plan: dict[str, str] | None = None,
                       example_inputs: Any = None) -> TracedParallel | TracedPipeline:
    """Apply ``plan`` (dp, zero, tp, pp, recompute, dtype) to any model along its repeated
    blocks; tp needs ``tp_plan`` (or the model's ``partita_tp_plan`` attribute). ``plan`` may
    be text; ``"auto"`` / ``"auto,gbs=8,dtype=fp32"`` traces the model on ``example_inputs``
    (or ``model.partita_example_inputs``) and searches the best plan the runtime can run for
    this world size (:func:`.auto.choose_traced_plan`; rank 0 prints it and the runner-up).
    With pp > 1 each rank keeps its stage only (:class:`.traced_pipeline.TracedPipeline`)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if isinstance(plan, str):
        plan = _resolve(model, plan, world, device_type, tp_plan, example_inputs)
    _check(plan)
    if plan.world_size != world:
        raise PartitaError(f"the plan has dp*tp*pp*cp = {plan.world_size} ranks, the process group {world}")
    units = traced_units(model)
    device_type = detect_device_type(device_type)
    device = local_device(device_type)
    model = model.to(device)
    make_optimizer = make_optimizer or (lambda params: torch.optim.AdamW(params, lr=3e-4, foreach=False))
    tp_plan = tp_plan or getattr(model, "partita_tp_plan", None)
    if plan.tp > 1 and not tp_plan:
        raise PartitaError(f"tp={plan.tp} needs a TP plan: parallelize_traced(..., tp_plan={{'<module>': "
                           "'colwise'|'rowwise'}}) or model.partita_tp_plan")
    setup = functools.partial(shard_blocks, plan=plan, tp_plan=tp_plan, make_optimizer=make_optimizer)
    if plan.pp > 1:  # pipeline over the block sequence (traced_pipeline.py)
        inputs = example_inputs if example_inputs is not None else getattr(model, "partita_example_inputs", None)
        return TracedPipeline(model, plan, device, functools.partial(setup, ddp=False), device_type,
                              example_inputs=inputs)
    from torch.distributed.device_mesh import init_device_mesh
    tp_mesh = dp_mesh = None
    if plan.tp > 1:
        grid = init_device_mesh(device_type, (plan.dp, plan.tp), mesh_dim_names=("dp", "tp"))
        tp_mesh, dp_mesh = grid["tp"], grid["dp"]
    elif plan.dp > 1 and plan.zero >= 1:
        dp_mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("dp",))
    model, optimizer = setup(model, units, tp_mesh, dp_mesh)
    return TracedParallel(model, optimizer, plan, units, device)


def shard_blocks(model: nn.Module, units: list[nn.Module], tp_mesh, dp_mesh, unit_paths: tuple[str, ...] | None = None,
                 *, plan: Plan, tp_plan: dict[str, str] | None, make_optimizer: Callable,
                 ddp: bool = True) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Tensor parallel from the TP plan on ``tp_mesh``, then recompute of ``units``, then data
    parallel on ``dp_mesh`` (FSDP2 per unit and the root for zero >= 1; DDP for zero 0 where
    ``ddp`` - a pipeline stage averages its gradients itself), then the optimizer over the
    (sharded) parameters. Returns the module to call and the optimizer."""
    if plan.tp > 1:
        apply_tp_plan(model, tp_plan or {}, tp_mesh, unit_paths)
    if plan.recompute == "full":
        apply_block_recompute(units)
    if plan.dp > 1 and plan.zero >= 1:
        param_dtype = _DTYPES[plan.dtype]
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype \
            else MixedPrecisionPolicy()
        for unit in units:
            fully_shard(unit, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=plan.zero >= 3)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=plan.zero >= 3)
        gather_on_outside_use(units)
    elif plan.dp > 1 and ddp:
        group = dp_mesh.get_group() if dp_mesh is not None else None
        model = nn.parallel.DistributedDataParallel(model, process_group=group)
    return model, make_optimizer(list(model.parameters()))


def _resolve(model: nn.Module, text: str, world: int, device_type: str | None, tp_plan: dict | None,
             example_inputs: Any) -> Plan:
    """A plan from text; ``auto...`` searches one (every rank runs the same deterministic search)."""
    if text.split(",")[0].strip() != "auto":
        return Plan.parse(text, world_size=world)
    from .auto import choose_traced_plan
    plan, report = choose_traced_plan(model, world, text, detect_device_type(device_type), tp_plan=tp_plan,
                                      example_inputs=example_inputs)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(report, flush=True)
    return plan
