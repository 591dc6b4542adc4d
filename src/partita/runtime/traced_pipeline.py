"""Pipeline parallel for traced models whose forward is a block sequence (issue 19).

Any model whose repeated blocks form one run (:attr:`BlockLayout.pipeline`) and are called
in order with the hidden state as their first argument, returning the next hidden state
(a ViT's encoder layers, a DiT's transformer blocks), is split over ``pp`` ranks without
knowing its forward: every stage runs the model's own forward with hooks -

* the blocks before the stage's first return their input unchanged (no work), and the
  stage's first block gets the activation received from the previous stage instead;
* at the call of the next stage's first block the forward stops (an exception the stage
  catches) and that block's input is sent on: whatever forward does after the stage's last
  block and before that call - a norm or projection between groups of blocks, plain tensor
  code - runs here, where its input is real (later stages run it on a pass-through whose
  result the received activation replaces: forward work they waste, no backward);
* the last stage runs to the model's output and the loss.

Schedule: 1F1B (the plan's default) or GPipe (:func:`schedule_order`); activations and their
gradients go stage to stage with posted sends (their dtype travels with them), waited on at
the end of the step.

Each stage holds only what it runs: built from one micro-batch (a forward stopped at the next
stage's first block and one ``autograd.grad`` of the tensor sent there), it keeps its blocks,
the modules its forward calls (the stem, on every stage; the head, on the last) and the owners of the
parameters its output depends on; every other module with parameters is replaced by an
empty :class:`_Dropped` (a block: pass-through). Then, as without pp
(:func:`.traced.shard_blocks`), the TP plan splits the stage's layers over its ``tp`` group,
its blocks are recomputed, and for zero >= 1 FSDP2 shards its blocks and the rest over its
``dp`` group (zero 0: the stage averages its gradients over the replicas itself). Ranks are
ordered (pp, dp, tp) as :mod:`partita.runtime.mesh`. Parameters used on more than one stage
(diffusers' DiT head reuses block 0's ``norm1.emb``) are held by each of those stages and
have their gradients summed over them. Known gap: the stem runs on every stage (its output
is replaced on all but the first).

A cut is exact only if nothing computed before it is used after it except the block input
that crosses it. Before the first step each stage traces the model on the example micro-batch
(:func:`partita.tracing.trace` on meta tensors, :mod:`partita.tracing.boundaries`) and every
stage refuses, in the same one line, a model whose blocks are called out of order or that
uses a tensor across a block (a skip connection) - the cost model refuses pp for the same
trace.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import PartitaError
from ..plan import Plan
from ..tracing.blocks import find_blocks

_HEADER = 8  # an activation's header: ndim, the sizes, and (last) its dtype's index in _DTYPES
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def split_micro_batches(inputs: Any, m: int) -> list[Any]:
    """``m`` micro-batches of ``inputs`` along dim 0 (tensors with a batch dimension)."""
    leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.dim()]
    batch = leaves[0].shape[0] if leaves else 0
    if batch % m:
        raise PartitaError(f"this rank's batch of {batch} samples does not split into {m} micro-batches")
    size = batch // m
    return [tree_map(lambda t: t[i * size:(i + 1) * size] if isinstance(t, torch.Tensor) and t.dim()
                     and t.shape[0] == batch else t, inputs) for i in range(m)]


SCHEDULES = ("1f1b", "gpipe")


def schedule_order(schedule: str, stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """The forward (``"F"``) and backward (``"B"``) passes of micro-batches ``0..m-1`` in the
    order ``stage`` runs them. GPipe [Huang et al. 2019]: every forward, then every backward
    in reverse - all ``m`` micro-batches' activations held at once. 1F1B [Narayanan et al.
    SC'21 sec. 2.2, PipeDream-Flush]: ``stages - stage - 1`` warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards - at most
    ``stages - stage`` micro-batches held (:func:`partita.cost.pipeline.in_flight_chunks`)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    warm = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


class _Stop(Exception):
    """Raised at the call of the next stage's first block: the rest of the forward is another stage's."""


class _Dropped(nn.Module):
    """What a stage holds in place of a module it does not run: no parameters. A block of
    another stage passes its hidden state through (as the blocks before the stage's first
    do); anything else refuses to run, naming the module."""

    def __init__(self, path: str, block: bool):
        super().__init__()
        self.path, self.block = path, block

    def forward(self, *args, **kwargs):
        if self.block:
            return args[0] if args else kwargs["hidden_states"]
        raise PartitaError(f"this pipeline stage dropped {self.path} (its forward did not use it when the stage "
                           "was built); the model's forward must call the same modules on every step")


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _send(t: torch.Tensor, dst: int) -> list[tuple[Any, torch.Tensor]]:
    """Post ``t`` (a header with its shape and dtype, then its data) to ``dst`` without
    waiting: (work, tensor) pairs to wait on before the step ends - a blocking send could
    deadlock 1F1B, where two neighbours each send before they receive."""
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = t.dim()
    header[1:1 + t.dim()] = torch.tensor(t.shape)
    header[-1] = _DTYPES.index(t.dtype)
    data = t.detach().contiguous()
    return [(dist.isend(header, dst), header), (dist.isend(data, dst), data)]


def _recv(src: int, device: torch.device) -> torch.Tensor:
    header = torch.zeros(_HEADER, dtype=torch.int64)
    dist.recv(header, src)
    shape = tuple(int(d) for d in header[1:1 + int(header[0])])
    t = torch.empty(shape, dtype=_DTYPES[int(header[-1])], device=device)
    dist.recv(t, src)
    return t


def _prune(module: nn.Module, prefix: str, used: set[str], keep: set[str], blocks: set[str]) -> None:
    """Replace every child of ``module`` that holds parameters and that nothing in ``used``
    lies in (a path in ``used`` or below it) by a :class:`_Dropped`; recurse into the rest."""
    for name, child in list(module.named_children()):
        path = f"{prefix}{name}"
        if path in keep or not any(True for _ in child.parameters()):
            continue
        if any(u == path or u.startswith(path + ".") for u in used):
            _prune(child, path + ".", used, keep, blocks)
        else:
            setattr(module, name, _Dropped(path, path in blocks))


class TracedPipeline:
    """One pipeline stage of a traced model; :meth:`train_step` runs one pipeline step.

    ``setup(module, units, tp_mesh, dp_mesh, unit_paths)`` applies tp, recompute and data
    parallel to the stage (:func:`.traced.shard_blocks` with ``ddp=False``) and returns
    ``(module, optimizer)``. The stage is built from ``example_inputs`` (one micro-batch) when
    given, else on the first :meth:`train_step` (``optimizer`` is None until then)."""

    def __init__(self, model: nn.Module, plan: Plan, device: torch.device, setup: Callable,
                 device_type: str = "cpu", example_inputs: Any = None):
        layout = find_blocks(model)
        if not layout.pipeline:
            raise PartitaError(f"pp={plan.pp} needs one sequence of repeated blocks; {type(model).__name__}: "
                               f"{layout.pipeline_problem() or 'no repeated blocks'}; use pp=1")
        blocks = [model.get_submodule(p) for p in layout.run]
        if plan.schedule not in SCHEDULES:
            raise PartitaError(f"schedule={plan.schedule}: the traced pipeline runs {' or '.join(SCHEDULES)}")
        if plan.pp > len(blocks):
            raise PartitaError(f"pp={plan.pp} exceeds the {len(blocks)} blocks of {type(model).__name__}")
        self.module, self.plan, self.device, self._setup = model, plan, device, setup
        self.optimizer: torch.optim.Optimizer | None = None
        self._groups(plan, device_type)
        n, p = len(blocks), plan.pp
        sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
        self.lo = sum(sizes[:self.stage])
        self.hi = self.lo + sizes[self.stage]
        self.paths = layout.run
        self.units = blocks[self.lo:self.hi]
        self._names = [name for name, _ in model.named_parameters()]  # the whole model's, the same on every stage
        self._incoming: torch.Tensor | None = None
        self._outgoing: torch.Tensor | None = None
        self._probing = False
        self._pending: list[tuple[Any, torch.Tensor]] = []  # posted sends not yet waited on
        if example_inputs is not None:
            self._build(self._to_device(split_micro_batches(example_inputs, 1)[0]))

    def _groups(self, plan: Plan, device_type: str) -> None:
        """This rank's stage, dp replica and tp rank in the mesh order (pp, dp, tp) - rank =
        (stage * dp + replica) * tp + tp_rank, the order :mod:`partita.runtime.mesh` and the cost
        model use - and the device mesh whose ``pp`` / ``dp`` / ``tp`` groups hold its replica's
        stages, its stage's replicas and its tensor-parallel peers."""
        from torch.distributed.device_mesh import init_device_mesh
        rank, dp, tp = dist.get_rank(), plan.dp, plan.tp
        self.mesh = init_device_mesh(device_type, (plan.pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        self.stage, self.stages = rank // (dp * tp), plan.pp
        self.replica, self.tp_rank = (rank // tp) % dp, rank % tp
        self.pp_group, self.dp_group = self.mesh["pp"].get_group(), self.mesh["dp"].get_group()

    def peer(self, stage: int) -> int:
        """Global rank of ``stage`` of this rank's replica and tp rank."""
        return (stage * self.plan.dp + self.replica) * self.plan.tp + self.tp_rank

    def _to_device(self, chunk: Any) -> Any:
        return tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t, chunk)

    def _replace_input(self, module, args, kwargs):
        if self._probing:
            return None
        if args:
            return (self._incoming, *args[1:]), kwargs
        return args, dict(kwargs, hidden_states=self._incoming)

    def _stop(self, module, args, kwargs):
        """Before the next stage's first block: its first input is what this stage sends."""
        self._outgoing = args[0] if args else kwargs["hidden_states"]
        raise _Stop

    def _check_cuts(self, chunk: Any) -> None:
        """Refuse, on every stage alike, a model whose blocks cannot be cut: traced on ``chunk``
        (:func:`partita.tracing.trace`, meta tensors), its blocks must be called once each in
        order and no tensor may be used across a block (a skip connection)."""
        from ..tracing import trace

        def loss(out):
            out = out.to_tuple() if hasattr(out, "to_tuple") else out
            leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
            return sum(t.float().sum() for t in leaves)
        spec = trace(self.module, chunk, loss_fn=loss)
        if spec.pipeline_blocker:
            raise PartitaError(f"pp={self.plan.pp} cannot cut {type(self.module).__name__} between its blocks: "
                               f"{spec.pipeline_blocker}; use pp=1 (dp, zero and tp still apply)")

    def _pass_earlier_blocks(self) -> None:
        """The blocks of earlier stages return their input; this stage's first block takes the
        received activation in place of its own input (after the first stage)."""
        blocks = [self.module.get_submodule(p) for p in self.paths]
        for block in blocks[:self.lo]:
            block.forward = lambda *args, **kwargs: args[0] if args else kwargs["hidden_states"]
        if self.stage > 0:
            blocks[self.lo].register_forward_pre_hook(self._replace_input, with_kwargs=True)

    def _stop_hook(self):
        """Stop this stage's forward at the call of the next stage's first block (non-last stages)."""
        if self.stage < self.stages - 1:
            return self.module.get_submodule(self.paths[self.hi]).register_forward_pre_hook(self._stop,
                                                                                            with_kwargs=True)
        return None

    def _build(self, chunk: Any) -> None:
        """Keep only what this stage runs (:meth:`_probe`, :func:`_prune`: its blocks, the
        modules its forward calls - the stem, the last stage's head, a block's submodule the
        model calls outside the block - and the modules whose parameters its output depends
        on), then apply tp, recompute and data parallel to it and build the optimizer."""
        self._check_cuts(chunk)
        self._pass_earlier_blocks()
        used = self._probe(chunk)
        _prune(self.module, "", used, set(self.paths[self.lo:self.hi]), set(self.paths))
        self.module, self.optimizer = self._setup(self.module, self.units, self.mesh["tp"], self.mesh["dp"],
                                                  self.paths)
        self._stop_hook()
        held = {name: _local(p).numel() for name, p in self.module.named_parameters()}
        self._sizes = torch.tensor([float(held.get(name, 0)) for name in self._names])
        dist.all_reduce(self._sizes, op=dist.ReduceOp.MAX, group=self.pp_group)

    def _probe(self, chunk: Any) -> set[str]:
        """Paths of the modules this stage's forward uses, from one forward of ``chunk`` (the
        stage's first block fed the stem's output, stopped at the next stage's first block) and one
        ``autograd.grad`` of its output: the modules it calls (blocks of earlier stages, which
        pass through, do not count; their submodules do) and the owners of the parameters the
        output depends on. Random state and buffers are restored afterwards."""
        model = self.module
        called: set[str] = set()
        skip = {id(b) for b in (model.get_submodule(p) for p in self.paths[:self.lo])}
        stop = self._stop_hook()  # first: the next stage's block stops the forward before it counts as called
        handles = [stop] if stop is not None else []
        handles += [m.register_forward_pre_hook(lambda mod, args, path=path: called.add(path))
                    for path, m in model.named_modules() if path and id(m) not in skip]
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        self._probing = True
        try:
            with torch.random.fork_rng(devices=[]):
                try:
                    out = model(**chunk) if isinstance(chunk, dict) else model(*chunk)
                except _Stop:
                    out = self._outgoing
        finally:
            self._probing = False
            for h in handles:
                h.remove()
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(buffers[name])
        out = out.to_tuple() if hasattr(out, "to_tuple") else out
        leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not leaves or not named:
            return called
        grads = torch.autograd.grad(sum(t.float().sum() for t in leaves), [p for _, p in named], allow_unused=True)
        return called | {name.rpartition(".")[0] for (name, _), g in zip(named, grads) if g is not None}

    def _forward(self, chunk: Any, loss_fn: Callable) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(received activation or None, the stage's output or the last stage's loss)."""
        received = None
        if self.stage > 0:
            received = _recv(self.peer(self.stage - 1), self.device).requires_grad_()
            self._incoming = received
        try:
            out = self.module(**chunk) if isinstance(chunk, dict) else self.module(*chunk)
        except _Stop:
            self._pending += _send(self._outgoing, self.peer(self.stage + 1))
            return received, self._outgoing
        return received, loss_fn(out, chunk) / self.plan.grad_accum

    def _backward(self, received: torch.Tensor | None, out: torch.Tensor) -> None:
        """Backward of one micro-batch: from the loss (last stage) or from the gradient the next
        stage sends; the input's gradient goes to the previous stage."""
        self._regather_root()
        if self.stage == self.stages - 1:
            out.backward()
        else:
            out.backward(_recv(self.peer(self.stage + 1), self.device))
        if received is not None:
            self._pending += _send(received.grad, self.peer(self.stage - 1))

    def _sum_shared_gradients(self) -> None:
        """Sum the gradients of parameters that more than one stage used (a model that calls a
        block's submodule again in its head - diffusers' DiT reuses ``transformer_blocks[0]
        .norm1.emb`` - trains it on the first and the last stage): the stages' counts, by the
        whole model's parameter names, are all-reduced once per step over this replica's
        stages, then the gradients of the shared ones (a stage without one adds zeros of its
        size). With dp > 1 at zero 0 the gradients are then averaged over the stage's replicas
        (data parallel: each replica computed the mean loss of its share of the batch); at
        zero >= 1 FSDP2 has reduce-scattered them in backward."""
        held = dict(self.module.named_parameters())
        used = torch.tensor([float(name in held and held[name].grad is not None) for name in self._names])
        dist.all_reduce(used, group=self.pp_group)
        for i, (name, count) in enumerate(zip(self._names, used.tolist())):
            if count < 2:
                continue
            if name in held:
                p = held[name]
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad
                buf = _local(p.grad).view(-1)
            else:
                buf = torch.zeros(int(self._sizes[i]), dtype=_DTYPES[0], device=self.device)
            dist.all_reduce(buf, group=self.pp_group)
        if self.plan.dp > 1 and self.plan.zero == 0:
            for p in held.values():
                if p.grad is not None:  # the same parameters on every replica of a stage
                    grad = _local(p.grad)
                    dist.all_reduce(grad, group=self.dp_group)
                    grad /= self.plan.dp

    def _regather_root(self) -> None:
        """Before each backward of a stage that is not the last, FSDP2 (zero >= 1) all-gathers
        the root module's own parameters (the stem, modules between blocks) again. The stage
        stops inside the root's forward, so FSDP never hooks the root's re-gather for backward,
        and the reshard after one micro-batch's backward would free a root parameter an earlier
        micro-batch's backward still needs (a module between blocks: its weight gives its
        input's gradient). ``unshard`` is not recursive: only the root's group, usually small;
        the blocks re-gather themselves."""
        if self.stage < self.stages - 1 and hasattr(self.module, "unshard"):
            self.module.unshard()

    def train_step(self, inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor]) -> float:
        """One pipeline step on ``inputs`` (every stage of a replica gets the replica's
        samples) in the plan's schedule (:func:`schedule_order`); returns the mean loss over
        the global batch."""
        m = self.plan.grad_accum
        last = self.stage == self.stages - 1
        chunks = [self._to_device(c) for c in split_micro_batches(inputs, m)]
        if self.optimizer is None:
            self._build(chunks[0])
        in_flight: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        total = torch.zeros((), device=self.device)
        for kind, i in schedule_order(self.plan.schedule, self.stages, self.stage, m):
            if kind == "F":
                in_flight[i] = self._forward(chunks[i], loss_fn)
                continue
            received, out = in_flight.pop(i)  # its activations are freed by this backward
            total += out.detach() if last else 0.0
            self._backward(received, out)
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
        self._sum_shared_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if last and self.plan.dp > 1:
            dist.all_reduce(total, group=self.dp_group)
            total /= self.plan.dp
        dist.broadcast(total, src=self.peer(self.stages - 1), group=self.pp_group)
        return float(total)
