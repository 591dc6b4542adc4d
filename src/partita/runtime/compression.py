"""The data-parallel communication knobs of a plan, applied to a parallelized model.

* ``grad_dtype`` bf16: DDP gets a bf16 compression hook (torch's ``bf16_compress_hook``
  where the backend runs it - it refuses anything but NCCL/XCCL - else the same algorithm
  here: cast the bucket to bf16 divided by the group size, all-reduce, copy back); FSDP2
  gets ``MixedPrecisionPolicy(reduce_dtype=bf16)`` (:func:`.data_parallel.apply_fsdp`);
  the bucketed :class:`.data_parallel.GradientSync` reduces its flat buffer in bf16.
* ``grad_compression`` powersgd: torch's ``powerSGD_hook`` with a ``PowerSGDState`` of
  rank ``powersgd_rank`` (error feedback and warm start on; compression from the second
  step, ``start_powerSGD_iter=2``, the earliest torch allows with error feedback). Only
  DDP has comm hooks: FSDP2's reduce-scatter has no hook that could carry low-rank
  factors, and the bucketed sync of tp/pp/ep models is not DDP, so those are refused in
  one line (plan validation already requires zero 0).
* ``ddp_bucket_mb``: DDP ``bucket_cap_mb`` (:func:`ddp_kwargs`); ``fsdp_prefetch``: FSDP2
  explicit forward/backward prefetch of that many blocks ahead (:func:`.data_parallel.apply_fsdp`).

The PowerSGD state (error feedback, warm-start factors, iteration, RNG) is rank-local; it
travels in checkpoints as tensors keyed by rank (:func:`compression_tensors`,
:func:`load_targets`, :func:`restore`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..errors import PartitaError
from ..plan import Plan

#: torch requires start_powerSGD_iter > 1 with error feedback / warm start: step 0 and 1
#: run plain all-reduce (DDP rebuilds its buckets after the first).
START_ITER = 2
PREFIX = "compression.powersgd"


def ddp_kwargs(plan: Plan) -> dict[str, Any]:
    """DistributedDataParallel constructor options of the plan (bucket size)."""
    return {"bucket_cap_mb": float(plan.ddp_bucket_mb)} if plan.ddp_bucket_mb else {}


def fsdp_kwargs(plan: Plan) -> dict[str, Any]:
    """apply_fsdp options of the plan: reduce dtype and prefetch depth."""
    return {"reduce_dtype": torch.bfloat16 if plan.grad_dtype == "bf16" and plan.dtype != "fp32" else torch.float32,
            "prefetch": plan.fsdp_prefetch}


def bf16_allreduce_hook(process_group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future:
    """torch's ``bf16_compress_hook`` algorithm on any backend: bf16(bucket / world),
    all-reduce (sum), decompress into the bucket in place."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


# DDP checks the hook's annotations against the real types; ``from __future__ import
# annotations`` made them strings
bf16_allreduce_hook.__annotations__ = {"process_group": dist.ProcessGroup, "bucket": dist.GradBucket,
                                       "return": torch.futures.Future[torch.Tensor]}


def apply_comm_knobs(modules: list[nn.Module], plan: Plan, grad_sync: Any, dp_group: dist.ProcessGroup | None):
    """Register the plan's gradient-reduction knob on the data-parallel wrapper; returns the
    PowerSGD state (None without PowerSGD). One-line refusal where the runtime cannot apply it."""
    ddp = modules[0] if modules and isinstance(modules[0], nn.parallel.DistributedDataParallel) else None
    bf16 = plan.grad_dtype == "bf16" and plan.dtype != "fp32"
    if plan.grad_compression == "powersgd":
        if ddp is None:
            if grad_sync is None and plan.dp * plan.cp == 1:
                return None  # one data-parallel rank: nothing to reduce
            raise PartitaError("plan not runnable: grad_compression=powersgd needs plain DDP in this runtime "
                               "(zero 0 with tp = pp = ep = 1): FSDP2 and the bucketed sync of model-parallel "
                               "plans have no comm hook for low-rank factors; use grad_dtype=bf16 there")
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=dp_group, matrix_approximation_rank=plan.powersgd_rank,
                                   start_powerSGD_iter=START_ITER, min_compression_rate=2,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
        keeper = PowerSGDLayouts(state, ddp.module)
        ddp.register_comm_hook(keeper, PowerSGDLayouts.hook)
        return keeper
    if bf16 and ddp is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        on_nccl = dist.get_backend(dp_group) in ("nccl", "xccl")
        ddp.register_comm_hook(dp_group, default_hooks.bf16_compress_hook if on_nccl else bf16_allreduce_hook)
    elif bf16 and grad_sync is not None and hasattr(grad_sync, "reduce_dtype"):
        grad_sync.reduce_dtype = torch.bfloat16
    return None


# ------------------------------------------------------------------ layouts and checkpoints
def _compressed(shape: torch.Size, rank: int) -> tuple[bool, int, int, int]:
    """(compressed?, n, m, r') of a gradient under torch's rule (``powerSGD_hook``: the
    tensor viewed as ``shape[0] x rest``, ``r' = min(n, m, rank)``, compressed when
    ``(n + m) r' * 2 < n m``)."""
    n = int(shape[0]) if len(shape) else 1
    m = int(math.prod(shape)) // max(n, 1)
    r = min(n, m, rank)
    return (n + m) * r * 2 < n * m, n, m, r


class PowerSGDLayouts:
    """torch's PowerSGD state, kept valid when DDP changes its bucket layout, and saved per
    parameter. The state is bucket-shaped (error feedback: the flat bucket; P, Q: the
    compressed tensors' factors concatenated in bucket order), and DDP rebuilds its buckets
    after the first iteration of every new DDP instance - which a resumed run is - so a
    restored bucket-shaped state would be applied to the wrong tensors. This hook (the
    DDP comm-hook state is this object) records each bucket's parameter order, re-lays
    the state out per parameter whenever that order changes, then calls
    ``powerSGD_hook``."""

    def __init__(self, state: Any, module: nn.Module):
        self.state = state
        self.names = {id(p): name for name, p in module.named_parameters()}
        self.layouts: dict[int, list[tuple[str, torch.Size]]] = {}
        self.pieces: dict[str, dict[str, torch.Tensor]] = {}  # name -> {"error", "p", "q"} not in a bucket

    @staticmethod
    def hook(self: "PowerSGDLayouts", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook
        idx = bucket.index()
        layout = [(self.names[id(p)], p.shape) for p in bucket.parameters()]
        if self.layouts.get(idx) != layout:
            keys = {name for name, _ in layout}
            for j, other in list(self.layouts.items()):  # stale buckets that held these parameters
                if j == idx or keys & {name for name, _ in other}:
                    self._to_pieces(j)
            self._from_pieces(idx, layout)
            self.layouts[idx] = layout
        return powerSGD_hook(self.state, bucket)

    def _to_pieces(self, idx: int) -> None:
        """Move bucket ``idx``'s state into per-parameter pieces."""
        layout = self.layouts.pop(idx, None)
        st = self.state
        if layout is None or idx not in st.error_dict:
            return
        self.pieces.update(self._split(idx, layout))
        for d in (st.error_dict, st.p_memory_dict, st.q_memory_dict):
            d.pop(idx, None)

    def _split(self, idx: int, layout: list) -> dict[str, dict[str, torch.Tensor]]:
        st = self.state
        err, pmem, qmem = st.error_dict.get(idx), st.p_memory_dict.get(idx), st.q_memory_dict.get(idx)
        out: dict[str, dict[str, torch.Tensor]] = {}
        e = 0
        for name, shape in layout:
            numel = int(math.prod(shape))
            out[name] = {"error": err[e:e + numel].clone()} if err is not None else {}
            e += numel
        p = q = 0
        for name, shape in self._factor_order(layout):
            _, n, m, r = _compressed(shape, st.matrix_approximation_rank)
            if pmem is not None and qmem is not None:
                out[name]["p"], out[name]["q"] = pmem[p:p + n * r].clone(), qmem[q:q + m * r].clone()
            p, q = p + n * r, q + m * r
        return out

    def _factor_order(self, layout: list) -> list[tuple[str, torch.Size]]:
        """The compressed tensors in the order the hook lays out P and Q: grouped by shape,
        shapes in order of first appearance in the bucket (``powerSGD_hook``'s
        ``shape_to_tensors``), bucket order within a shape."""
        groups: dict[tuple, list] = {}
        for name, shape in layout:
            if _compressed(shape, self.state.matrix_approximation_rank)[0]:
                groups.setdefault(tuple(shape), []).append((name, shape))
        return [item for group in groups.values() for item in group]

    def _from_pieces(self, idx: int, layout: list) -> None:
        """Assemble bucket ``idx``'s state from the pieces of all its parameters (when every
        one has them; otherwise torch starts this bucket afresh)."""
        if not layout or not all(name in self.pieces and "error" in self.pieces[name] for name, _ in layout):
            return
        pieces = [self.pieces.pop(name) for name, _ in layout]
        st = self.state
        st.error_dict[idx] = torch.cat([pc["error"] for pc in pieces])
        by_name = {name: pc for (name, _), pc in zip(layout, pieces)}
        compressed = [by_name[name] for name, _ in self._factor_order(layout)]
        if compressed and all("p" in pc for pc in compressed):
            st.p_memory_dict[idx] = torch.cat([pc["p"] for pc in compressed])
            st.q_memory_dict[idx] = torch.cat([pc["q"] for pc in compressed])

    def per_parameter(self) -> dict[str, dict[str, torch.Tensor]]:
        """The whole state per parameter name (a copy)."""
        out = {name: dict(pc) for name, pc in self.pieces.items()}
        for idx, layout in self.layouts.items():
            out.update(self._split(idx, layout))
        return out


PowerSGDLayouts.hook.__annotations__ = {"self": PowerSGDLayouts, "bucket": dist.GradBucket,  # DDP checks them
                                         "return": torch.futures.Future[torch.Tensor]}


def _state_of(pm) -> PowerSGDLayouts | None:
    return getattr(pm, "compression_state", None)


def compression_tensors(pm) -> dict[str, torch.Tensor]:
    """This rank's PowerSGD state as checkpoint tensors, per parameter (keys name the rank:
    the error feedback differs on every rank)."""
    keeper = _state_of(pm)
    if keeper is None:
        return {}
    state, mine = keeper.state, f"{PREFIX}.rank{dist.get_rank()}."
    out: dict[str, torch.Tensor] = {mine + "iter": torch.tensor(float(state.iter), dtype=torch.float64)}
    _, keys, pos, has_gauss, cached = state.rng.get_state()
    out[mine + "rng"] = torch.tensor(np.concatenate([keys.astype(np.float64), [pos, has_gauss, cached]]),
                                     dtype=torch.float64)
    for name, piece in keeper.per_parameter().items():
        for kind, t in piece.items():
            out[f"{mine}{kind}.{name}"] = t
    return out


def load_targets(pm, path) -> dict[str, torch.Tensor]:
    """Empty tensors for this rank's PowerSGD entries in the checkpoint at ``path`` (shapes
    from its metadata), for ``dcp.load`` to fill; {} without PowerSGD or entries."""
    if _state_of(pm) is None:
        return {}
    import torch.distributed.checkpoint as dcp
    meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    mine = f"{PREFIX}.rank{dist.get_rank()}."
    return {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in meta.items()
            if k.startswith(mine) and hasattr(m, "size")}


def restore(pm, loaded: dict[str, torch.Tensor]) -> None:
    """Put the loaded PowerSGD tensors back (as per-parameter pieces, laid out into buckets
    at the next hook call); no-op without them."""
    keeper = _state_of(pm)
    mine = f"{PREFIX}.rank{dist.get_rank()}."
    entries = {k[len(mine):]: v for k, v in loaded.items() if k.startswith(mine)}
    if keeper is None or not entries:
        return
    state = keeper.state
    state.iter = int(entries.pop("iter").item())
    rng = entries.pop("rng").numpy()
    state.rng.set_state(("MT19937", rng[:624].astype(np.uint32), int(rng[624]), int(rng[625]), float(rng[626])))
    device = next(iter(pm.parameters())).device
    for d in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
        d.clear()
    keeper.layouts.clear()
    keeper.pieces = {}
    for key, t in entries.items():
        kind, name = key.split(".", 1)
        keeper.pieces.setdefault(name, {})[kind] = t.to(device)


# ------------------------------------------------------------------ measurement
#: element bytes of the dtypes a Kinetic trace names in a collective's "Input type"
TRACE_DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
                     "unsigned char": 1, "bool": 1, "signed char": 1, "short int": 2}


def trace_collective_bytes(trace: dict) -> dict[str, dict[str, float]]:
    """Bytes and calls per collective in one rank's Chrome trace (torch.profiler with
    ``record_shapes=True``): the ``gloo:<op>`` events carry each call's buffer shape and
    dtype ("Input Dims", "Input type") - the tensors the backend really sent, so this is an
    oracle independent of the cost model. Buffer bytes (the nccl-tests size), not per-link."""
    out: dict[str, dict[str, float]] = {}
    for e in trace.get("traceEvents", []):
        name = str(e.get("name", ""))
        if not name.startswith("gloo:"):
            continue
        args = e.get("args") or {}
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        size = 0.0
        for d, t in zip(dims, types):
            numel = 1
            for n in (d if isinstance(d, list) else []):
                numel *= int(n)
            size += numel * TRACE_DTYPE_BYTES.get(str(t), 4)
        entry = out.setdefault(name[len("gloo:"):], {"bytes": 0.0, "calls": 0})
        entry["bytes"] += size
        entry["calls"] += 1
    return out


def powersgd_state_numel(keeper: PowerSGDLayouts | None) -> dict[str, int]:
    """Elements torch's PowerSGD state holds (error feedback, warm-start P and Q: the hook
    all-reduces P and Q once per step each) and its own count of elements sent
    (``total_numel_after_compression``, cumulative) - oracles for the cost model."""
    if keeper is None:
        return {}
    st = keeper.state
    out = {name: int(sum(t.numel() for t in getattr(st, name).values()))
           for name in ("error_dict", "p_memory_dict", "q_memory_dict")}
    out["total_numel_before_compression"] = int(st.total_numel_before_compression)
    out["total_numel_after_compression"] = int(st.total_numel_after_compression)
    return out
