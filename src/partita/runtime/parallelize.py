"""``parallelize(model, plan)``: apply a plan, in this order, and return a trainable object.

1. mesh (pp, dp, cp, tp) - the axis order of :data:`partita.plan.MESH_AXES`
2. pipeline split into stage modules (each step below applies to every stage)
3. tensor + sequence parallel (DTensor)        - before anything wraps the modules
4. expert parallel (shards experts, all-to-all) - after TP, before data parallel
5. activation recomputation                      - wraps block forwards
6. data parallel by ZeRO stage (FSDP2 last, as torchtitan orders it: it must see the
   final, TP-sharded parameters)
7. optimizer (ZeRO-1 sharded where asked), gradient clipping over all shards
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from ..errors import PartitaError
from ..plan import Plan, axis_index, check, chunk_ranks
from .compression import apply_comm_knobs, ddp_kwargs, fsdp_kwargs
from .data_parallel import GradientSync, ShardedOptimizer, apply_fsdp
from .device import detect_device_type, local_device
from .limits import etp_refusal, runtime_check  # noqa: F401  (runtime_check: its home was here; callers import it from here)
from .mesh import build_mesh, new_subgroups
from ..models.registry import family_of
from ..models.init import is_meta
from .modules import aux_loss, logits as logits_of
from .recompute import SPLIT_BACKWARD_SCHEDULES as SPLIT_BACKWARD, apply_recompute
from .traced import is_traced_model, parallelize_traced

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
#: packed SFT rows under context parallel: cp's attention masks by global position only
PACKED_CP = ("packed SFT rows (position ids restarting per sample) run without cp in this runtime: its "
             "context-parallel attention masks causally by global position, not per sample; run cp=1")


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy; with tensor parallel the logits stay sharded on the vocab
    and the caller runs forward and backward inside ``loss_parallel()``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass
class ParallelModel:
    """A model with a plan applied. ``train_step(inputs, targets)`` takes this data-parallel
    rank's share of the global batch (``gbs / dp`` sequences) and returns the global mean loss."""

    plan: Plan
    modules: list[nn.Module]  # this rank's model or pipeline stages
    optimizer: object
    device: torch.device
    mesh: object
    max_grad_norm: float | None = 1.0
    grad_sync: Callable[[], None] | None = None
    schedule: object | None = None
    scaler: object | None = None
    _autocast: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)
    pp_group: dist.ProcessGroup | None = None
    dp_group: dist.ProcessGroup | None = None
    ep_group: dist.ProcessGroup | None = None
    #: called as ``hook(i)`` after micro-batch ``i``'s backward (tests measure what is held there)
    micro_batch_hook: Callable[[int], None] | None = None
    #: MoE load-balancing losses recorded by pipeline stages in this step (see moe_aux.py)
    aux_record: dict = field(default_factory=dict)
    #: context parallel: the sequence positions (columns of the batch) this rank trains on
    cp_positions: torch.Tensor | None = None
    #: called as ``gate(local_loss, grad_norm) -> update`` after the gradients are reduced
    #: (and unscaled) and before clipping and the optimizer step; False drops the
    #: gradients without an update. The trainer's non-finite guard and stop
    #: agreement live there (partita.train.guard), not in the runtime.
    update_gate: Callable[[float, float], bool] | None = None
    #: a meta-device model's HF directory (None: initialised from its seed, or not meta) and
    #: how many values this rank wrote into its shards (runtime/materialize.py)
    init_source: str | None = None
    init_read: int = 0

    @property
    def model(self) -> nn.Module:
        return self.modules[0]

    def parameters(self):
        for m in self.modules:
            yield from m.parameters()

    def state_dict(self) -> dict:
        out = {}
        for m in self.modules:
            out.update(m.state_dict())
        return out

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> float:
        """``positions``: packed SFT rows' position ids (restarting per sample; the model then
        attends within each sample only, train/sft_data.py); targets -100 carry no loss."""
        plan = self.plan
        if self.cp_positions is not None:  # context parallel: this rank's sequence chunks
            inputs, targets = inputs[:, self.cp_positions], targets[:, self.cp_positions]
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        if positions is not None and self.cp_positions is not None:
            raise PartitaError(PACKED_CP)
        m = plan.grad_accum
        if inputs.shape[0] != plan.mbs * m:
            raise PartitaError(f"train_step got {inputs.shape[0]} sequences, this rank needs gbs/dp = {plan.mbs * m}")
        with loss_parallel() if plan.tp > 1 else contextlib.nullcontext():
            if self.schedule is not None:
                local = self._pipeline_step(inputs, targets, positions)
            else:
                local = self._accumulate(inputs, targets, positions)
        if self.grad_sync is not None:
            self.grad_sync()
        self._clip_and_step(local)
        return self._mean_over_dp(local)

    @torch.no_grad()
    def eval_loss(self, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> float:
        """Forward only, no update: the global mean language-model loss of one batch (same
        arguments as :meth:`train_step`) - the mean over micro-batches and data-parallel (x cp)
        ranks of each micro-batch's mean token cross-entropy. Unlike the training loss it
        leaves out the MoE load-balancing losses (Megatron reports "lm loss" apart from them):
        they are a training penalty, not a measure of fit, and this way the number is the same
        with and without pipeline stages."""
        if self.cp_positions is not None:  # context parallel: this rank's sequence chunks
            if positions is not None:
                raise PartitaError(PACKED_CP)
            inputs, targets = inputs[:, self.cp_positions], targets[:, self.cp_positions]
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        with loss_parallel() if self.plan.tp > 1 else contextlib.nullcontext():
            if self.schedule is not None:  # the last stage's loss (the other stages add 0)
                local = self._sum_over_pipeline(self._run_schedule(self.schedule.eval, inputs, targets, positions))
            else:
                local = self._forward_loss(inputs, targets, positions)
        return self._mean_over_dp(local)

    def _forward_loss(self, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None) -> float:
        """:meth:`eval_loss` without pipeline stages: the micro-batches' mean loss (no aux loss)."""
        model = self.model
        core = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        m = self.plan.grad_accum
        total = 0.0
        pos_chunks = positions.to(self.device).chunk(m) if positions is not None else [None] * m
        for x, y, pos in zip(inputs.chunk(m), targets.chunk(m), pos_chunks):
            with self._autocast():
                if pos is not None:  # HF models: transformers masks packed samples from the position ids
                    out = core(input_ids=x, position_ids=pos, use_cache=False)
                else:
                    out = logits_of(core, x)
                loss = cross_entropy(out.logits if hasattr(out, "logits") else out, y)
            total += float((loss.to_local() if isinstance(loss, DTensor) else loss).float()) / m
        return total

    def _mean_over_dp(self, local: float) -> float:
        """This rank's loss averaged over the data-parallel (x cp) ranks: equal token counts,
        so the mean of their means is the global mean."""
        loss = torch.tensor([local], dtype=torch.float64)
        if self.dp_group is not None and dist.get_world_size(self.dp_group) > 1:
            dist.all_reduce(loss, group=self.dp_group)
            loss /= dist.get_world_size(self.dp_group)
        return float(loss.item())

    def _accumulate(self, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> float:
        model = self.model
        m = self.plan.grad_accum
        total = 0.0
        pos_chunks = positions.to(self.device).chunk(m) if positions is not None else [None] * m
        for i, (x, y, pos) in enumerate(zip(inputs.chunk(m), targets.chunk(m), pos_chunks)):
            if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 (zero 2/3)
                model.set_requires_gradient_sync(reduce_every_micro_batch(self.plan) or i == m - 1)
            sync = model.no_sync() if isinstance(model, nn.parallel.DistributedDataParallel) and i < m - 1 \
                else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    core = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
                    if pos is not None:  # HF models: transformers masks packed samples from the position ids
                        out = model(input_ids=x, position_ids=pos, use_cache=False)
                    else:
                        out = model(x) if core is not model else logits_of(model, x)
                    out = out.logits if hasattr(out, "logits") else out
                    loss = cross_entropy(out, y)
                    if isinstance(loss, DTensor):  # vocab-parallel loss: replicated; add the aux loss locally
                        loss = loss.to_local()
                    loss = loss + aux_loss(core).to(self.device)
                scaled = loss / m
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            total += float(loss.detach().float()) / m
            if self.micro_batch_hook is not None:
                self.micro_batch_hook(i)
        return total

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> float:
        """One pipeline training step (the schedule's ``step``: forward and backward); its loss
        includes the MoE load-balancing losses, as its gradients do."""
        local = self._run_schedule(self.schedule.step, inputs, targets, positions)
        from .moe_aux import recorded_aux_sum
        m = self.plan.grad_accum
        local += recorded_aux_sum(self.aux_record, m) / m  # MoE load-balancing losses of this rank's layers
        # the loss lives on the last stage, the aux losses on every stage: sum along the pipeline
        return self._sum_over_pipeline(local)

    def _run_schedule(self, run: Callable, inputs: torch.Tensor, targets: torch.Tensor,
                      positions: torch.Tensor | None) -> float:
        """Run ``run`` (the schedule's ``step`` or forward-only ``eval``) over this rank's
        micro-batches: the last stage's mean loss over them, 0 on the other stages. Packed
        rows' ``positions`` go to every stage as a keyword (HF stages mask samples from them)."""
        losses: list[torch.Tensor] = []
        self.aux_record.clear()
        is_first = any(_end(mod, "tok_embeddings", "embed_tokens") for mod in self.modules)
        is_last = any(_end(mod, "output", "lm_head") for mod in self.modules)
        extra = {} if positions is None else {"position_ids": positions.to(self.device)}
        with self._autocast():
            args = (inputs,) if is_first else ()
            run(*args, target=targets if is_last else None, losses=losses if is_last else None, **extra)
        return sum(float(l.detach().float()) for l in losses) / self.plan.grad_accum

    def _sum_over_pipeline(self, local: float) -> float:
        """``local`` summed over the pipeline group: every stage then reports the step's loss."""
        value = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(value, group=self.pp_group)
        return float(value.item())

    def _clip_and_step(self, local: float) -> None:
        """Clip to ``max_grad_norm`` over all shards and step; the ``update_gate``, if set,
        sees this rank's loss and the norm first and may skip the update."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        total = self.grad_norm() if self.max_grad_norm or self.update_gate is not None else 0.0
        if self.update_gate is not None and not self.update_gate(local, total):
            self.optimizer.zero_grad(set_to_none=True)
            return
        if self.max_grad_norm:
            coef = self.max_grad_norm / (total + 1e-6)
            if coef < 1:
                grads = [p.grad for p in self.parameters() if p.grad is not None]
                torch._foreach_mul_(grads, coef) if _same_kind(grads) else [g.mul_(coef) for g in grads]
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def grad_norm(self) -> float:
        """L2 norm of the full gradient across tp/fsdp shards, pipeline stages and experts.

        DTensor gradients are grouped by (mesh, placements) and reduced once per group;
        expert gradients (different on every ep rank) are summed over the ep group and
        everything over the pipeline group."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in self.parameters():
            if p.grad is None:
                continue
            g = p.grad
            if getattr(p, "_partita_expert", False):
                key: tuple = ("expert",)
            elif isinstance(g, DTensor):
                key = ("dtensor", id(g.device_mesh), tuple(g.placements))
            else:
                key = ("local",)
            groups.setdefault(key, []).append(g)
        dense_sq = torch.zeros((), dtype=torch.float64)
        expert_sq = torch.zeros((), dtype=torch.float64)
        for key, grads in groups.items():
            norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            sq = norm.detach().double().cpu() ** 2
            if key[0] == "expert":
                expert_sq += sq
            else:
                dense_sq += sq
        if self.ep_group is not None:
            dist.all_reduce(expert_sq, group=self.ep_group)
        total = (dense_sq + expert_sq).reshape(1)
        if self.pp_group is not None and dist.get_world_size(self.pp_group) > 1:
            dist.all_reduce(total, group=self.pp_group)
        return math.sqrt(float(total.item()))


def _end(stage: nn.Module, ours: str, hf: str) -> bool:
    """Whether a pipeline stage holds the embedding / output layer (reference or HF names)."""
    inner = getattr(stage, "model", None)
    return getattr(stage, ours, None) is not None or getattr(stage, hf, None) is not None \
        or (isinstance(inner, nn.Module) and getattr(inner, hf, None) is not None)


def reduce_every_micro_batch(plan: Plan) -> bool:
    """Sharded gradient accumulation (``grad_accum_mode="sharded"``, zero 2/3): FSDP
    reduce-scatters every micro-batch into the gradient shard, so a rank never holds more
    than its 1/dp of the gradients - what the planner counts for ZeRO-2/3."""
    return plan.zero >= 2 and plan.grad_accum_mode == "sharded"


def _same_kind(grads: list[torch.Tensor]) -> bool:
    """foreach kernels need all-DTensor (on one mesh) or all-plain lists."""
    kinds = {(type(g), id(g.device_mesh)) if isinstance(g, DTensor) else (type(g), None) for g in grads}
    return len(kinds) == 1


def parallelize(model: nn.Module, plan: Plan | str, make_optimizer: Callable[[list], torch.optim.Optimizer] | None = None,
                device_type: str | None = None, max_grad_norm: float | None = 1.0) -> ParallelModel:
    """Apply ``plan`` to ``model`` (a :class:`partita.models.Transformer` or HF model,
    identical on every rank) with PyTorch's parallel primitives. A model built on the meta
    device is sharded first and each rank then materialises only its shards (from the
    model's seed or its HF directory; :mod:`.materialize`). The process group must be
    initialised with ``plan.world_size`` ranks. ``plan`` may be text: ``"dp=2,tp=2"``, or
    ``"auto"`` / ``"auto,gbs=8,mbs=1"`` to search the best plan for this world size and
    machine (:mod:`.auto`; rank 0 prints the choice and the runner-up)."""
    if is_traced_model(model):  # a ViT, UNet, DiT, ...: along its repeated blocks (runtime/traced.py, issue 19)
        if isinstance(plan, str) and plan.split(",")[0].strip() == "auto":  # searched (runtime/auto.py)
            return parallelize_traced(model, plan, make_optimizer, device_type)
        traced_plan = Plan.parse(plan, dist.get_world_size()) if isinstance(plan, str) else plan
        if traced_plan.etp > 1:
            raise PartitaError("plan not runnable: " + etp_refusal(traced_plan))
        return parallelize_traced(model, traced_plan, make_optimizer, device_type)
    world = dist.get_world_size()
    device_type = detect_device_type(device_type)
    if isinstance(plan, str):
        plan = resolve_plan(plan, model, world, device_type)
    check(plan, None, world)
    runtime_check(plan, model)
    _inject_lora(model, plan)
    device = local_device(device_type)
    mesh = build_mesh(plan, device_type)
    make_optimizer = make_optimizer or (lambda params: torch.optim.AdamW(params, lr=3e-4, foreach=False))
    source = None
    if is_meta(model):  # built on the meta device: storage for this rank's shards only (materialize.py)
        from .materialize import init_source, move_buffers
        source, model = init_source(model), move_buffers(model, device)
    else:
        model = model.to(device)
    # 2. pipeline stages
    if plan.pp > 1:
        from .pipeline import stage_modules
        modules = [mod for _, mod in stage_modules(model, plan)]
    elif positions_from_shard(model, plan):
        from .hf_pipeline import hf_stage
        modules = [hf_stage(model, list(range(len(model.model.layers))), True, True)]
    else:
        modules = [model]
    ep_group, edp_group = _apply_model_parallel(modules, plan, mesh, _folds_experts_over_tp(model, plan))
    cp_positions = None
    if plan.cp > 1:
        from .context_parallel import apply_cp
        for mod in modules:
            cp_positions = apply_cp(mod, mesh["cp"].get_group(), plan.seq_len, plan.cp)
    aux_record: dict[int, list] = {}
    if plan.pp > 1:
        from .moe_aux import attach_aux_losses
        for mod in modules:
            attach_aux_losses(mod, aux_record)
    # 5. recomputation
    for mod in modules:
        apply_recompute(mod, plan.recompute, plan.recompute_layers, plan.pp > 1 and plan.schedule in SPLIT_BACKWARD)
    data_mesh = _data_mesh(plan, mesh, device_type)
    fsdp = data_mesh.size() > 1 and plan.zero >= 2  # FSDP2 shards meta parameters; DDP needs real ones
    written = _materialize(modules, device, source, ep_group, plan) if source is not None and not fsdp else 0
    modules, grad_sync, autocast = _apply_data_parallel(modules, plan, data_mesh, device_type, edp_group)
    if source is not None and fsdp:
        written = _materialize(modules, device, source, ep_group, plan)
    dp_group = None
    if data_mesh.size() > 1:
        dp_group = data_mesh.get_group() if data_mesh.ndim == 1 else mesh["dp"].get_group()
    compression_state = apply_comm_knobs(modules, plan, grad_sync, dp_group)  # grad_dtype, PowerSGD
    optimizer = _build_optimizer(modules, plan, make_optimizer, dp_group, edp_group)
    scaler = torch.amp.GradScaler(device_type) if plan.dtype == "fp16" else None
    pm = ParallelModel(plan=plan, modules=modules, optimizer=optimizer, device=device, mesh=mesh,
                       max_grad_norm=max_grad_norm, grad_sync=grad_sync, scaler=scaler, _autocast=autocast,
                       pp_group=mesh["pp"].get_group() if plan.pp > 1 else None, dp_group=dp_group, ep_group=ep_group)
    pm.aux_record = aux_record
    pm.compression_state = compression_state  # PowerSGD state: checkpointed (runtime/compression.py)
    pm.cp_positions = cp_positions
    pm.lora_config = getattr(model, "partita_lora", None)
    pm.init_source, pm.init_read = getattr(source, "path", None) and str(source.path), written
    if plan.pp > 1:
        from .pipeline import build_schedule
        pm.schedule = build_schedule(list(zip(virtual_stages_of_rank(plan), modules)), plan, device,
                                     mesh["pp"].get_group(), cross_entropy)
    return pm


def positions_from_shard(model: nn.Module, plan: Plan) -> bool:
    """Whether ``model``'s own forward would take token positions from the length of a
    sequence-parallel or context-parallel shard (HF models): it then runs as a one-stage
    :class:`~.hf_pipeline.HFStage`, which gets them from the full input or the cp chunks."""
    return family_of(model).positions_from_input and (plan.tp > 1 and plan.sp or plan.cp > 1)


def _inject_lora(model: nn.Module, plan: Plan) -> None:
    """``finetune=lora``: PEFT's LoRA layers, base frozen (runtime/lora.py), unless the caller
    (the trainer, with ``--adapter``) injected them already."""
    if plan.finetune == "lora":
        from .lora import has_lora, inject_lora
        if not has_lora(model):
            inject_lora(model, plan)


def _materialize(modules: list[nn.Module], device: torch.device, source, ep_group, plan: Plan) -> int:
    """Storage and values for this rank's shards of a meta model (see :mod:`.materialize`)."""
    from .materialize import materialize_shards
    return materialize_shards(modules, device, source, ep_group, plan.ep if ep_group is not None else 1)


def resolve_plan(text: str, model: nn.Module, world: int, device_type: str) -> Plan:
    """A plan from text; ``auto...`` searches one (every rank the same, deterministically)."""
    if text.split(",")[0].strip() != "auto":
        return Plan.parse(text, world_size=world)
    from .auto import choose_plan
    plan, report = choose_plan(model, world, text, device_type)
    if dist.get_rank() == 0:
        print(report, flush=True)
    return plan


def _folds_experts_over_tp(model: nn.Module, plan: Plan) -> bool:
    """Whether a reference MoE model under tp without ep keeps its routed experts' states
    apart (sharded over dp x cp x tp, as with ep; see :func:`.mesh.expert_mesh`). Decided
    on the whole model, so every rank - also of a pipeline stage without MoE layers -
    creates the same process groups."""
    from ..models.llama import MoE
    return plan.ep == 1 and plan.tp > 1 and not 0 < plan.dp_shard < plan.dp \
        and any(isinstance(m, MoE) for m in model.modules())


def _apply_model_parallel(modules: list[nn.Module], plan: Plan, mesh, experts_apart: bool = False) -> tuple:
    """3. tensor + sequence parallel, 4. expert parallel; returns the (ep, edp) groups.
    ``experts_apart`` (tp, no ep): the routed experts, whole on every rank, are marked as
    experts so that their states are sharded over edp x tp like ep's (edp = dp x cp)."""
    if plan.tp > 1:
        from .tensor_parallel import apply_tp
        for mod in modules:
            apply_tp(mod, mesh["tp"], plan.sp)
    ep_group = edp_group = None
    if plan.ep > 1:
        from .expert_parallel import apply_ep
        ep_group = new_subgroups(plan, "ep")
        edp_group = new_subgroups(plan, "edp")
        for mod in modules:
            apply_ep(mod, ep_group, plan.ep)
    elif experts_apart:
        from ..models.llama import MoE
        edp_group = new_subgroups(plan, "edp")
        for mod in modules:
            for moe in (m for m in mod.modules() if isinstance(m, MoE)):
                for p in moe.experts.parameters():
                    p._partita_expert = True
    if plan.finetune == "lora":  # DTensor's styles make new Parameters with requires_grad=True: freeze again
        from .lora import freeze_base
        freeze_base(modules)
    return ep_group, edp_group


def _data_mesh(plan: Plan, mesh, device_type: str):
    """The ranks that average gradients: the dp axis, dp x cp flattened with context
    parallel (each cp rank's loss covers its own tokens; Megatron reduces over dp x cp too),
    or, for HSDP (``0 < dp_shard < dp``), the dp axis as a 2-D (replicate, shard) mesh."""
    if 0 < plan.dp_shard < plan.dp:
        from .mesh import hsdp_mesh
        return hsdp_mesh(plan, device_type)
    return mesh["dp", "cp"]._flatten("dp_cp") if plan.cp > 1 else mesh["dp"]


def _apply_data_parallel(modules: list[nn.Module], plan: Plan, data_mesh, device_type: str, edp_group) -> tuple:
    """6. data parallel by ZeRO stage over ``data_mesh``: (modules, gradient sync or None, autocast)."""
    ndp = data_mesh.size()
    dp_group = data_mesh.get_group() if ndp > 1 and data_mesh.ndim == 1 else None  # HSDP (2-D) is FSDP only
    param_dtype = DTYPES.get(plan.dtype)
    grad_sync = None
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    if ndp > 1 and plan.zero >= 2:
        edp_mesh = None
        if edp_group is not None:
            from .mesh import expert_mesh
            edp_mesh = expert_mesh(plan, device_type)["edp_tp"]
        for mod in modules:
            apply_fsdp(mod, data_mesh, plan.zero, param_dtype, edp_mesh, plan.dp * plan.cp * plan.tp, **fsdp_kwargs(plan))
        return modules, None, autocast
    if param_dtype is not None:
        autocast = lambda: torch.autocast(device_type=device_type, dtype=param_dtype)  # noqa: E731
    plain = plan.tp == 1 and plan.pp == 1 and plan.ep == 1
    if ndp > 1 and plain and plan.zero == 0:
        modules = [nn.parallel.DistributedDataParallel(modules[0], process_group=dp_group, broadcast_buffers=False,
                                                       **ddp_kwargs(plan))]
    elif ndp > 1:
        grad_sync = GradientSync([p for mod in modules for p in mod.parameters()], dp_group, edp_group)
    return modules, grad_sync, autocast


def _build_optimizer(modules: list[nn.Module], plan: Plan, make_optimizer, dp_group, edp_group):
    """7. the optimizer: ZeRO-1 shards dense parameters over dp x cp and experts over
    edp x tp (their tp peers hold the same experts: :func:`.mesh.expert_mesh`)."""
    params = [p for mod in modules for p in mod.parameters() if p.requires_grad]  # LoRA: adapters only
    if not (plan.zero == 1 and dp_group is not None):
        return make_optimizer(params)
    dense = [p for p in params if not getattr(p, "_partita_expert", False)]
    experts = [p for p in params if getattr(p, "_partita_expert", False)]
    parts: list = [ShardedOptimizer(dense, make_optimizer, dp_group)]
    if edp_group is not None and plan.tp > 1:  # every rank creates the groups, with experts or not
        edp_group = new_subgroups(plan, "edp_tp")  # (a pipeline stage may hold no MoE layer)
    if experts:
        parts.append(ShardedOptimizer(experts, make_optimizer, edp_group) if edp_group else _Wrapped(make_optimizer(experts)))
    return _CombinedOptimizer(parts)


def virtual_stages_of_rank(plan: Plan) -> list[int]:
    """Virtual stage indices this pipeline rank holds (stage j on rank j % pp; DualPipeV's V:
    :func:`partita.plan.chunk_ranks`), in order."""
    pp_rank = axis_index(plan, "pp", dist.get_rank())
    return [j for j, rank in enumerate(chunk_ranks(plan.pp, plan.vpp, plan.schedule)) if rank == pp_rank]


class _Wrapped:
    def __init__(self, opt):
        self.optimizer = opt
        self.param_groups = opt.param_groups

    def step(self):
        self.optimizer.step()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


class _CombinedOptimizer:
    """Several (sharded) optimizers stepped together."""

    def __init__(self, parts: list):
        self.parts = parts
        self.param_groups = [g for p in parts for g in p.param_groups]

    def step(self) -> None:
        for p in self.parts:
            p.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parts:
            p.zero_grad(set_to_none=set_to_none)
