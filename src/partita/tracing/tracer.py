"""``partita.trace(model, example_inputs)``: measure what the planner needs of any model.

One forward and one backward pass on the meta device (no memory, no compute: shapes
only), under

* ``torch.utils.flop_counter.FlopCounterMode`` - FLOPs per module, forward and backward
  (matmul-like ops: ``2mkn`` per GEMM; attention through the fused kernel of
  :mod:`.attention`);
* ``torch.autograd.graph.saved_tensors_hooks`` - every tensor autograd saves for backward,
  counted once per storage (views share their base's bytes), parameters and buffers
  excluded, attributed to the block running when it is saved;
* forward hooks on the blocks (:mod:`.blocks`) - their inputs (what a checkpointed block
  keeps) and outputs (what a pipeline boundary sends).

The model is not changed: its parameters are swapped for meta copies for the call
(``torch.func.functional_call``), gradients go through ``torch.autograd.grad`` (no
``.grad`` is written). A model whose forward needs real data (``.tolist()``,
data-dependent shapes such as token routing) cannot run on meta; ``on="real"`` traces it
on its own device with real tensors (small shapes only) - ``on="auto"`` (default) tries
meta first and falls back to real for models whose parameters are not on meta.
"""
from __future__ import annotations

import fnmatch
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from ..errors import PartitaError
from ..spec.traced import TracedBlock, TracedSpec
from .attention import FusedAttentionMode
from .blocks import BlockLayout, find_blocks
from .boundaries import BoundaryWatch
from .fastmeta import FastMetaBackward
from .owners import BackwardOwners, tag
from .replay import Replays

if TYPE_CHECKING:
    from .inference import InferenceTrace

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _key(t: torch.Tensor) -> int:
    """Identity of a tensor's storage (views share it)."""
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


@dataclass
class _Recorder:
    """State the hooks fill during the traced forward."""

    state_keys: set[int]
    units: set[str]
    col: set[str] = field(default_factory=set)
    row: set[str] = field(default_factory=set)
    attention: FusedAttentionMode | None = None
    current: list[str] = field(default_factory=list)  # unit stack
    leaf: list[str] = field(default_factory=list)  # innermost tp module stack
    keep: list[torch.Tensor] = field(default_factory=list)  # strong refs: storage ids stay unique
    saved: dict[int, tuple[str, int, bool]] = field(default_factory=dict)  # key -> (owner, bytes, tp-split)
    col_outputs: set[int] = field(default_factory=set)
    inputs: dict[str, dict[int, int]] = field(default_factory=dict)
    outputs: dict[str, dict[int, int]] = field(default_factory=dict)
    allreduce: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    attention_flops: dict[str, float] = field(default_factory=dict)
    fake: int = 0  # keys of replayed storages (negative: never a real storage id)
    sources: dict[str, str] = field(default_factory=dict)  # replayed unit -> the unit it copies
    before: set[str] = field(default_factory=set)  # modules outside the units first called before any unit
    seen: set[str] = field(default_factory=set)  # modules outside the units called so far
    stem_calls: set[str] = field(default_factory=set)  # any module called outside a unit before any unit ran
    head_calls: set[str] = field(default_factory=set)  # ... and after (a block's submodule the head calls too)
    entered: int = 0  # unit calls so far
    after: dict[str, int] = field(default_factory=dict)  # module called outside the units -> units entered before its last call
    calls: dict[str, list[int]] = field(default_factory=dict)  # ... -> units entered before each of its calls
    watch: BoundaryWatch | None = None  # tensors read across a block boundary (forward only)
    outside_at: dict[int, int] = field(default_factory=dict)  # storage saved outside the units -> units entered

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return t
        k = _key(t)
        if k in self.state_keys or k in self.saved:
            return t
        self.keep.append(t)
        owner = self.current[-1] if self.current else ""
        split = bool(self.attention and self.attention.active) or k in self.col_outputs or \
            bool(self.leaf and self.leaf[-1] in self.row)
        self.saved[k] = (owner, _nbytes(t), split)
        if not owner:  # outside the units: where, by the blocks entered so far (0 stem, all: head)
            self.outside_at[k] = self.entered
        return t

    def replay(self, path: str, source: str) -> None:
        """Copy the saved storages and all-reduce bytes of ``source`` to the replayed ``path``."""
        for owner, nbytes, split in [v for v in self.saved.values() if v[0] == source]:
            self.fake -= 1
            self.saved[self.fake] = (path, nbytes, split)
        if source in self.allreduce:
            self.allreduce[path] = self.allreduce[source]
        self.sources[path] = source

    def tensors(self, tree: Any) -> dict[int, int]:
        out = {}
        for t in tree_flatten(tree)[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and _key(t) not in self.state_keys:
                self.keep.append(t)
                out[_key(t)] = _nbytes(t)
        return out


def _hooks(model: nn.Module, rec: _Recorder) -> list:
    """Forward hooks on the units (stack, inputs, outputs) and the tp plan's modules."""
    handles = []
    for path, module in model.named_modules():
        if path in rec.units:
            def pre(mod, args, kwargs, path=path):
                tag((args, kwargs), "")  # what ran before this unit is not its backward
                rec.current.append(path)
                rec.entered += 1
                if rec.watch is not None:
                    rec.watch.enter_block(path, args, kwargs)
                if path not in rec.inputs:
                    rec.order.append(path)
                    rec.inputs[path] = rec.tensors((args, kwargs))

            def post(mod, args, kwargs, out, path=path):
                rec.current.pop()
                tag(out, path)
                if rec.watch is not None:
                    rec.watch.leave_block()
                rec.outputs.setdefault(path, rec.tensors(out))
            handles += [module.register_forward_pre_hook(pre, with_kwargs=True),
                        module.register_forward_hook(post, with_kwargs=True)]
        elif path:
            inside = any(path.startswith(u + ".") for u in rec.units)

            def phase(mod, args, path=path, inside=inside):
                if rec.current:
                    return
                (rec.head_calls if rec.order else rec.stem_calls).add(path)
                rec.after[path] = rec.entered
                rec.calls.setdefault(path, []).append(rec.entered)
                if not inside and path not in rec.seen:
                    rec.seen.add(path)
                    if not rec.order:  # no unit has run yet: the stem (patch/time embedding)
                        rec.before.add(path)
            handles.append(module.register_forward_pre_hook(phase))
        if path in rec.col or path in rec.row:
            def tp_pre(mod, args, path=path):
                rec.leaf.append(path)

            def tp_post(mod, args, out, path=path):
                rec.leaf.pop()
                owner = rec.current[-1] if rec.current else ""
                if path in rec.col:
                    rec.col_outputs.update(rec.tensors(out))
                else:
                    rec.allreduce[owner] = rec.allreduce.get(owner, 0) + sum(rec.tensors(out).values())
            handles += [module.register_forward_pre_hook(tp_pre), module.register_forward_hook(tp_post)]
    return handles


def _tp_modules(model: nn.Module, layout: BlockLayout, tp_plan: dict[str, str] | None) -> tuple[set[str], set[str]]:
    """Paths of the column- and row-wise modules a transformers/torchtitan-style ``tp_plan``
    names (patterns on the full path, or relative to a block: ``"attention.wq"``)."""
    col, row = set(), set()
    if not tp_plan:
        return col, row
    units = sorted(layout.units, key=len, reverse=True)
    for path, module in model.named_modules():
        rel = next((path[len(u) + 1:] for u in units if path.startswith(u + ".")), None)
        for pattern, style in tp_plan.items():
            if fnmatch.fnmatchcase(path, pattern) or (rel is not None and fnmatch.fnmatchcase(rel, pattern)):
                style = str(style).lower()
                (col if "colwise" in style else row if "rowwise" in style else set()).add(path)
    if tp_plan and not (col or row):
        raise PartitaError(f"tp_plan names no module of {type(model).__name__} (patterns {', '.join(tp_plan)}); "
                           "write module paths such as 'layers.*.attention.wq' or block-relative 'attention.wq'")
    return col, row


def _to_meta(tree: Any) -> Any:
    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, tree)


def _first_float(out: Any) -> torch.Tensor:
    if hasattr(out, "to_tuple"):  # transformers / diffusers ModelOutput
        out = out.to_tuple()
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t
    raise PartitaError("the traced model's output holds no floating tensor that depends on the parameters; "
                       "pass loss_fn=lambda output: <scalar loss> to trace()")


def _run(model: nn.Module, args: tuple, kwargs: dict, on_meta: bool, rec: _Recorder,
         loss_fn: Callable[[Any], torch.Tensor] | None, replay: bool = True) -> tuple[dict, dict]:
    """Forward + backward under the counters; FLOPs by module path, forward and total."""
    state = {n: p for n, p in model.named_parameters()}
    state.update(dict(model.named_buffers()))
    if on_meta:
        state = {n: t.detach().to("meta").requires_grad_(t.requires_grad) for n, t in state.items()}
        args, kwargs = _to_meta(args), _to_meta(kwargs)
    rec.state_keys = {_key(t) for t in state.values()}
    attention = FusedAttentionMode()
    rec.attention = attention
    handles = _hooks(model, rec)
    replays = Replays(model, rec.units, rec) if on_meta and replay else None
    try:
        with (FastMetaBackward() if on_meta else nullcontext()), FlopCounterMode(display=False) as counter, attention, \
                BackwardOwners(counter.flop_registry) as owners:
            rec.watch = BoundaryWatch()
            with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), rec.watch:
                out = functional_call(model, state, args, kwargs)
            counts = counter.get_flop_counts()
            forward = {k: float(sum(v.values())) for k, v in counts.items()}
            attn = {k: float(v.get(torch.ops.partita.fused_attention, 0)) for k, v in counts.items()}
            loss = loss_fn(out) if loss_fn else _first_float(out).float().sum()
            tag(loss, "")
            wrt = [t for t in state.values() if t.requires_grad]
            torch.autograd.grad(loss, wrt, allow_unused=True)
            total = {k: float(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    finally:
        for h in handles:
            h.remove()
        if replays is not None:
            replays.restore()
    root = type(model).__name__
    strip = lambda d: {("" if k == root else k[len(root) + 1:]): v for k, v in d.items()
                       if k == root or k.startswith(root + ".")} | {"<global>": d.get("Global", 0.0)}
    rec.attention_flops = strip(attn)
    forward, total = strip(forward), strip(total)
    for path in rec.units:  # a unit's backward: its own nodes' (:mod:`.owners`), not the tracker's window
        if path in forward:
            total[path] = forward[path] + owners.flops.get(path, 0.0)
    for path, source in (replays.pairs if replays else []):
        _add_replayed(forward, total, rec.attention_flops, path, source)
    return forward, total


def _add_replayed(forward: dict, total: dict, attention: dict, path: str, source: str) -> None:
    """Credit a replayed unit, its ancestors and the whole model with ``source``'s FLOPs
    (its forward, and the backward of the autograd nodes it created: :mod:`.owners`)."""
    f, t = forward.get(source, 0.0), total.get(source, 0.0)
    attention[path] = attention.get(source, 0.0)
    parts = path.split(".")
    for target in ["<global>", ""] + [".".join(parts[:i]) for i in range(1, len(parts))]:
        if target in forward:  # modules the counter tracked (it never sees a container that is not called)
            forward[target] += f
            total[target] = total.get(target, 0.0) + t
    forward[path], total[path] = f, t


def _split_params(model: nn.Module, paths: list[str], row: set[str]) -> int:
    """Parameters a TP plan splits among the modules at ``paths``: all of a column-wise layer's
    (weight rows and bias), only the weight of a row-wise layer - its bias is added once after
    the all-reduce and stays whole on every rank (Megatron-LM's RowParallelLinear, torch's
    ``RowwiseParallel``: bias ``Replicate()``)."""
    return sum(t.numel() for p in paths for t in model.get_submodule(p).parameters(recurse=False)
               if p not in row or t.dim() >= 2)


def _blocks(model: nn.Module, rec: _Recorder, fwd: dict, total: dict) -> tuple[TracedBlock, ...]:
    """One :class:`TracedBlock` per unit, in the order forward ran them."""
    params = {p: sum(t.numel() for t in model.get_submodule(p).parameters()) for p in rec.order}
    kept: set[int] = {k for k, (owner, _, _) in rec.saved.items() if owner == ""}
    out = []
    for path in rec.order:
        mine = [(b, s) for owner, b, s in rec.saved.values() if owner == path]
        new_inputs = {k: b for k, b in rec.inputs[path].items() if k not in kept}
        kept.update(new_inputs)
        tp_params = _split_params(model, [p for p in rec.col | rec.row if p.startswith(path + ".")], rec.row)
        src = rec.sources.get(path, path)  # a replayed unit's inner modules did not run: its source's did
        tp_flops = sum(fwd.get(p, 0.0) for p in rec.col | rec.row if p.startswith(src + "."))
        tp_flops += rec.attention_flops.get(path, 0.0) if tp_params else 0.0
        out.append(TracedBlock(
            name=path, params=params[path], forward_flops=fwd.get(path, 0.0),
            backward_flops=total.get(path, 0.0) - fwd.get(path, 0.0),
            saved_bytes=float(sum(b for b, _ in mine)), recompute_bytes=float(sum(new_inputs.values())),
            output_bytes=float(sum(rec.outputs.get(path, {}).values())),
            attention_forward_flops=rec.attention_flops.get(path, 0.0),
            matmuls=sum(1 for t in model.get_submodule(path).parameters() if t.dim() >= 2),
            tp_params=tp_params, tp_forward_flops=tp_flops,
            tp_saved_bytes=float(sum(b for b, s in mine if s)) if tp_params else 0.0,
            tp_allreduce_bytes=float(rec.allreduce.get(path, 0))))
    return tuple(out)


def trace(model: nn.Module, example_inputs: Any, *, tp_plan: dict[str, str] | None = None,
          loss_fn: Callable[[Any], torch.Tensor] | None = None, name: str | None = None,
          batch: int | None = None, on: str = "auto", replay: bool = True, mode: str = "train",
          seq_len: int | None = None) -> TracedSpec | InferenceTrace:
    """Trace ``model`` on ``example_inputs`` (a tensor, a tuple of positional inputs, or a
    dict of keyword inputs) and return its :class:`TracedSpec` for the planner.

    ``tp_plan``: ``{module pattern: "colwise" | "rowwise"}`` as transformers'
    ``base_model_tp_plan`` and torchtitan write it; ``loss_fn``: turns the output into a
    scalar (default: the sum of the first floating output); ``batch``: samples in the
    example batch (default: the first input's first dimension); ``on``: ``"meta"``,
    ``"real"`` or ``"auto"`` (module docstring); ``replay``: trace each distinct block call
    once and replay identical ones (:mod:`.replay`, meta only). ``mode="inference"``: the forward
    only, under ``torch.no_grad`` - an :class:`.inference.InferenceTrace` (peak live bytes, FLOPs;
    ``seq_len`` names the pair axes), see :mod:`.inference`."""
    args, kwargs = _split_inputs(example_inputs)
    if mode not in ("train", "inference"):
        raise PartitaError(f"trace(mode={mode!r}): use 'train' (forward and backward) or 'inference' (forward only)")
    if mode == "inference":
        from .inference import trace_inference
        return trace_inference(model, args, kwargs, seq_len=seq_len, on="real" if on == "real" else "fake")
    if on not in ("auto", "meta", "real"):
        raise PartitaError(f"trace(on={on!r}): use 'meta', 'real' or 'auto'")
    layout = find_blocks(model)
    col, row = _tp_modules(model, layout, tp_plan)
    real_params = any(p.device.type != "meta" for p in model.parameters())
    attempts = ["meta"] if on == "meta" else ["real"] if on == "real" else (["meta", "real"] if real_params else ["meta"])
    for i, where in enumerate(attempts):
        rec = _Recorder(set(), set(layout.units), col, row)
        try:
            fwd, total = _run(model, args, kwargs, where == "meta", rec, loss_fn, replay)
            break
        except PartitaError:
            raise
        except Exception as e:  # the model's own code failed on meta tensors
            if i + 1 < len(attempts):
                continue
            hint = ("; trace it with real tensors on a small shape: trace(model, inputs, on='real')"
                    if where == "meta" else "")
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise PartitaError(f"tracing {type(model).__name__} on {where} tensors failed in its forward/backward: "
                               f"{msg}{hint}") from None
    return _assemble(model, layout, rec, fwd, total, args, kwargs, tp_plan, name, batch)


def _stem(rec: _Recorder) -> list[str]:
    """The outermost modules outside the units that forward first called before any unit ran,
    none holding a unit (the FLOP counter attributes a module's FLOPs to it and to every
    module entered around it: a ViT's ``vit`` holds the layers, ``vit.embeddings`` counts)."""
    before = {p for p in rec.before if not any(u.startswith(p + ".") for u in rec.units)}
    return [p for p in before if not any(p.startswith(q + ".") for q in before)]


def _between(rec: _Recorder, run: tuple[str, ...]) -> tuple[list[str], str]:
    """(the outermost modules outside the units that forward calls after a unit and before
    another - a norm or projection between two groups of blocks, which the traced pipeline
    runs on the stage of the block before them -, the reason a pipeline cannot cut between
    the blocks or "").

    Cuts need the blocks called once each in container order, no block's own submodule
    called from outside it between two blocks (its stage would not be the block's), and no
    tensor used across a block boundary (:class:`.boundaries.BoundaryWatch`)."""
    inside = [p for p, n in rec.after.items() if any(0 < k < rec.entered for k in rec.calls.get(p, [n]))]
    outer = sorted(p for p in inside if not any(p.startswith(q + ".") for q in inside))
    in_unit = [p for p in outer if any(p.startswith(u + ".") for u in rec.units)]
    if rec.order != list(run) or rec.entered != len(run):
        return outer, (f"its forward calls its {len(run)} blocks {rec.entered} times or not in the order of their "
                       "container")
    if in_unit:
        return outer, f"its forward calls {in_unit[0]}, part of a block, between two blocks"
    if rec.watch is not None and rec.watch.crossing:
        return outer, rec.watch.crossing
    return outer, ""


def _between_work(model: nn.Module, rec: _Recorder, paths: list[str], fwd: dict,
                  total: dict) -> tuple[tuple[str, int, float, float, tuple[int, ...]], ...]:
    """(path, parameters, forward and backward FLOPs per call, blocks entered before each
    call) of each module forward calls between two blocks."""
    out = []
    for p in paths:
        calls = rec.calls.get(p, [])
        n = max(1, len(calls))
        f = fwd.get(p, 0.0)
        out.append((p, sum(t.numel() for t in model.get_submodule(p).parameters()), f / n,
                    (total.get(p, 0.0) - f) / n, tuple(k for k in calls if 0 < k < rec.entered)))
    return tuple(out)


def _saved_outside(rec: _Recorder, pipeline: bool) -> dict[str, Any]:
    """Bytes saved outside the units where a pipeline stage keeps them: before the first unit
    (the stem's: the first stage), after the last (the head's: the last stage) and, by the
    units entered before, between two (the stage of the unit before them). Without a
    pipeline, no placement (the cost model keeps them all on the one stage)."""
    if not pipeline:
        return {}
    at: dict[int, float] = {}
    for k, n in rec.outside_at.items():
        at[n] = at.get(n, 0.0) + rec.saved[k][1]
    return {"stem_saved_bytes": at.pop(0, 0.0), "head_saved_bytes": at.pop(rec.entered, 0.0),
            "between_saved": tuple(sorted(at.items()))}


def _held_outside(model: nn.Module, rec: _Recorder, tp_layers: list[str], between: list[str]) -> dict[str, Any]:
    """What a pipeline stage holds besides its blocks, as the traced pipeline runtime
    (:mod:`partita.runtime.traced_pipeline`) keeps it: the direct parameters of the modules
    called outside any block before the first block ran (the stem - every stage runs it), of
    the root and of every ancestor of those modules or of a block (never dropped); the head's
    (called outside any block after one ran) on the last stage only. A block's own submodule
    called from outside it (diffusers' DiT head calls block 0's ``norm1.emb``) is listed as
    ``(block index, parameters, 0 stem | 1 head)``. Each parameter tensor is counted once.
    Modules called between two blocks (``between``) are not the head's: the spec lists them
    apart (:func:`_between_work`), held by the stages that reach them."""
    units = {u: i for i, u in enumerate(rec.order)}
    ancestors = lambda paths: {".".join(p.split(".")[:i]) for p in paths for i in range(p.count(".") + 1)}
    every = {""} | rec.stem_calls | ancestors(rec.stem_calls | set(units))
    head = {p for p in (rec.head_calls | ancestors(rec.head_calls)) - every
            if not any(p == b or p.startswith(b + ".") for b in between)}
    stem = last = 0
    shared: dict[tuple[int, int], int] = {}
    seen: set[int] = set()
    for path, module in model.named_modules():
        where = 0 if path in every else 1 if path in head else None
        block = next((i for u, i in units.items() if path == u or path.startswith(u + ".")), None)
        if where is None:
            continue
        for t in module.parameters(recurse=False):
            if id(t) in seen:
                continue
            seen.add(id(t))
            if block is not None:
                shared[block, where] = shared.get((block, where), 0) + t.numel()
            elif where == 0:
                stem += t.numel()
            else:
                last += t.numel()
    return {"stem_params": stem, "head_params": last, "stem_tp_params": _split_params(model, [p for p in tp_layers if p in every], rec.row),
            "shared_block_params": tuple((i, n, w) for (i, w), n in sorted(shared.items()))}


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise PartitaError(f"example_inputs must be a tensor, a tuple of tensors or a dict of keyword tensors, "
                       f"got {type(example_inputs).__name__}")


def _assemble(model: nn.Module, layout: BlockLayout, rec: _Recorder, fwd: dict, total: dict, args: tuple,
              kwargs: dict, tp_plan: dict | None, name: str | None, batch: int | None) -> TracedSpec:
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if batch is None:
        batch = int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 1
    first = next((p for p in model.parameters() if p.is_floating_point()), None)
    dtype = _DTYPES.get(first.dtype if first is not None else torch.float32, "fp32")
    units = _blocks(model, rec, fwd, total)
    top = [(p, sum(t.numel() for t in m.parameters()), fwd.get(p, 0.0)) for p, m in model.named_modules()
           if p and p.count(".") < 2]
    block_cls = type(model.get_submodule(layout.run[0])).__name__ if layout.run else ""
    outside = [p for p in rec.col | rec.row if not any(p == u or p.startswith(u + ".") for u in layout.units)]
    between, blocker = _between(rec, layout.run)
    between = between if layout.pipeline and not blocker else []  # only a pipeline places them apart
    return TracedSpec(
        name=name or type(model).__name__, batch=batch, dtype=dtype,
        inputs=tuple(tuple(int(d) for d in t.shape) for t in tensors),
        total_params=sum(p.numel() for p in model.parameters()),
        forward_flops=fwd.get("<global>", 0.0), backward_flops=total.get("<global>", 0.0) - fwd.get("<global>", 0.0),
        saved_bytes=float(sum(b for _, b, _ in rec.saved.values())), block_class=block_cls,
        block_container=layout.container, blocks=units,
        pipeline=layout.pipeline and len(units) == len(layout.run) and not blocker,
        pipeline_blocker=(blocker if layout.pipeline and len(units) == len(layout.run) else layout.pipeline_problem()),
        between=_between_work(model, rec, between, fwd, total),
        tp_plan=tuple(sorted((str(k), str(v)) for k, v in (tp_plan or {}).items())), modules=tuple(top),
        tp_other_params=_split_params(model, outside, rec.row),
        stem_forward_flops=sum(fwd.get(p, 0.0) for p in _stem(rec)),
        stem_backward_flops=sum(total.get(p, 0.0) - fwd.get(p, 0.0) for p in _stem(rec)),
        **_held_outside(model, rec, outside, between),
        **_saved_outside(rec, layout.pipeline and len(units) == len(layout.run) and not blocker),
        source=f"partita.trace of {type(model).__module__}.{type(model).__qualname__}, inputs "
               f"{[tuple(t.shape) for t in tensors]}")
