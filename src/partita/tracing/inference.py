"""``partita.trace(model, inputs, mode="inference")``: what one forward pass costs, with no backward.

Training cost (:mod:`.tracer`) is about the tensors autograd saves; inference keeps none of
them, and its peak is the largest set of tensors alive *at once* during the forward -
intermediates freed as soon as the Python code drops them. This module counts exactly that:

* the forward runs under ``torch.no_grad()`` on **fake tensors**
  (``torch._subclasses.FakeTensorMode``: shapes, dtypes and a device, no memory, no compute),
  so any input size can be traced on a laptop. Fake rather than meta because models branch
  on the device type (transformers' ESMFold asks ``torch.get_autocast_dtype(device)``, which
  refuses "meta"); the fake tensors report the model's own device.
* a ``TorchDispatchMode`` sees every aten op after autograd and decompositions: each new
  storage an op returns is added to the live bytes, and a ``weakref.finalize`` on the storage
  (torch keeps one Python object per live storage) takes it off when the last tensor using
  it dies - the moment the caching/host allocator gets it back. Views share their base's
  storage and cost nothing. The running maximum is the activation peak; the module running
  then is ``peak_at``.
* FLOPs by torch's own formulas (``torch.utils.flop_counter.flop_registry``, the table
  ``FlopCounterMode`` uses), and per op the bytes it reads and writes, for a roofline time.

Peak memory = weights (parameters and buffers, each storage once) + inputs + the activation
peak. Not counted: kernel workspaces that never become tensors (BLAS packing buffers, cuDNN /
oneDNN scratch) and allocator rounding - the measured side of ``bench/esmfold_sweep.py``
shows how much they are on a CPU.

A data-dependent Python branch (``if mask.all():``, ``.item()``) cannot be decided on fake
tensors; a boolean reads ``True`` (ESM's ``padding_mask.all()``: no padding) and a number 0
(a valid index: ESMFold's pTM indexes with ``tuple(argmax)``) and the
count is kept in ``data_dependent``; so is ``nonzero``, whose size reads as every element
(the upper bound: ESMFold's pTM head takes ``nonzero()[0]`` of an argmax mask). A model whose *shapes* depend on data (``nonzero``,
token routing) cannot be traced without values: ``on="real"`` runs the same count on real
tensors (small inputs only).
"""
from __future__ import annotations

import sys
import weakref
from functools import lru_cache
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from ..errors import PartitaError
from ..spec.hardware import Device

aten = torch.ops.aten
#: eager PyTorch's host time per dispatched op (Python -> dispatcher -> kernel launch). On a GPU
#: the CPU issues kernels ahead of the device and this only matters for tiny kernels; 8 us is the
#: order of a CUDA launch plus the dispatcher (PyTorch's own "eager overhead" figures are 5-10 us).
OP_OVERHEAD_S = 8e-6


def _storages(tree: Any) -> dict[int, int]:
    """Storage key -> bytes of every strided tensor in ``tree`` (views and ties counted once)."""
    out = {}
    for t in tree_flatten(tree)[0]:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            out[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return out


@dataclass
class InferenceTrace:
    """What one forward pass of a model on given inputs costs (bytes, FLOPs, op counts)."""

    weights_bytes: int  # parameters + buffers, each storage once
    input_bytes: int
    activation_peak_bytes: int  # most bytes alive at once in tensors the forward created
    peak_at: str  # the innermost module running at that moment ("" = the model's own code)
    pair_bytes_at_peak: int  # of those, tensors with at least two axes of length ``seq_len``
    seq_len: int | None
    flops: float  # forward FLOPs (torch's flop_registry formulas)
    gemm_flops_by_size: list[tuple[float, int, bool]] = field(default_factory=list)  # (flops, count, pair) per GEMM
    memory_bytes: float = 0.0  # bytes read + written by the ops that are not GEMMs
    pair_memory_bytes: float = 0.0  # ... of them by ops whose output is pair-shaped
    ops: int = 0  # aten ops dispatched (each one host dispatch / kernel launch)
    data_dependent: int = 0  # data-dependent scalars read as True/0 and nonzero sizes (see the module docstring)
    knobs: dict[str, Any] = field(default_factory=dict)  # model settings applied for this trace

    @property
    def peak_bytes(self) -> int:
        """Weights + inputs + the activation peak: the device memory the forward needs."""
        return self.weights_bytes + self.input_bytes + self.activation_peak_bytes

    def seconds(self, device: Device, dtype: str = "fp32", op_overhead_s: float = OP_OVERHEAD_S,
                pair_split: int = 1) -> float:
        """Roofline time of the forward on ``device``: each GEMM at the device's achievable
        GEMM rate for its size (:func:`partita.cost.compute.gemm_time`: ``eff x size / (size +
        gemm_half_gflop)``), everything else at the achievable memory bandwidth (``hbm_tbps x
        memory_bandwidth``) for the bytes it reads and writes, plus a host overhead per op.
        Sums rather than overlaps them: eager PyTorch runs one kernel at a time. ``pair_split``:
        the work of ops with a pair-shaped output divided over that many devices (each GEMM
        ``1/pair_split`` the size), the rest replicated (:mod:`.knobs`)."""
        from ..cost.compute import gemm_time
        peak_dtype = dtype if device.supports(dtype) else "bf16"
        gemm = sum(gemm_time(device, f * n / (pair_split if pair else 1), peak_dtype, n)
                   for f, n, pair in self.gemm_flops_by_size)
        moved = self.memory_bytes - self.pair_memory_bytes * (1 - 1 / pair_split)
        memory = moved / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)
        return gemm + memory + self.ops * op_overhead_s

    def to_dict(self) -> dict[str, Any]:
        return {"weights_bytes": self.weights_bytes, "input_bytes": self.input_bytes,
                "activation_peak_bytes": self.activation_peak_bytes, "peak_bytes": self.peak_bytes,
                "peak_at": self.peak_at, "pair_bytes_at_peak": self.pair_bytes_at_peak, "seq_len": self.seq_len,
                "flops": self.flops, "memory_bytes": self.memory_bytes, "ops": self.ops,
                "data_dependent": self.data_dependent, "knobs": dict(self.knobs)}


class _LiveBytes(TorchDispatchMode):
    """Live bytes of the storages the ops create, their maximum, FLOPs and traffic per op."""

    def __init__(self, known: set[int], seq_len: int | None, modules: list[str]) -> None:
        super().__init__()
        self.known = known  # weights and inputs: not activations
        self.seq_len = seq_len
        self.modules = modules  # the module stack, kept by forward hooks
        self.live: dict[int, tuple[int, bool]] = {}  # storage key -> (bytes, pair-like)
        self.now = self.peak = self.pair_now = self.pair_peak = 0
        self.peak_at = ""
        self.flops = 0.0
        self.gemms: dict[tuple[float, bool], int] = {}
        self.memory_bytes = self.pair_memory_bytes = 0.0
        self.ops = 0
        self.data_dependent = 0

    def _free(self, key: int) -> None:
        nbytes, pair = self.live.pop(key, (0, False))
        self.now -= nbytes
        self.pair_now -= nbytes if pair else 0

    def _pair(self, t: torch.Tensor) -> bool:
        return self.seq_len is not None and sum(1 for d in t.shape if d == self.seq_len) >= 2

    def _track(self, out: Any) -> int:
        """Add the new storages in ``out``; the bytes they hold."""
        new = 0
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.known or key in self.live:
                continue
            pair = self._pair(t)
            self.live[key] = (st.nbytes(), pair)
            self.now += st.nbytes()
            self.pair_now += st.nbytes() if pair else 0
            new += st.nbytes()
            weakref.finalize(st, self._free, key)
        if self.now > self.peak:
            self.peak, self.pair_peak = self.now, self.pair_now
            self.peak_at = self.modules[-1] if self.modules else ""
        return new

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and isinstance(args[0], torch._subclasses.FakeTensor):
            self.data_dependent += 1
            return True if args[0].dtype == torch.bool else 0
        if func is aten.nonzero.default and isinstance(args[0], torch._subclasses.FakeTensor):
            self.data_dependent += 1  # as if every element were non-zero: the most memory it can take
            out = args[0].new_empty((args[0].numel(), args[0].dim()), dtype=torch.long)
            self.ops += 1
            self._track(out)
            return out
        out = func(*args, **kwargs)
        self.ops += 1
        new = self._track(out)
        packet = func._overloadpacket
        pair = any(self._pair(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            self.flops += flops
            self.gemms[flops, pair] = self.gemms.get((flops, pair), 0) + 1
        elif new:  # a view moves nothing; an op that makes a tensor reads its inputs and writes it
            moved = new + sum(_storages((args, kwargs)).values())
            self.memory_bytes += moved
            self.pair_memory_bytes += moved if pair else 0
        return out


def _module_stack(model: nn.Module, stack: list[str]) -> list:
    """Hooks keeping ``stack`` = the modules running now, innermost last (they return None:
    a forward hook's return value would replace the module's output)."""
    def enter(module: nn.Module, _args: Any, path: str) -> None:
        stack.append(path)

    def leave(module: nn.Module, _args: Any, _out: Any) -> None:
        stack.pop()
    handles = []
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda m, a, p=path: enter(m, a, p)))
        handles.append(module.register_forward_hook(leave))
    return handles


def _device_of(model: nn.Module) -> torch.device:
    """Where the model would run: its parameters' device, or the CPU for a meta model."""
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


@lru_cache(maxsize=1)
def _fake_mode() -> Any:
    """One fake mode for every trace: models that cache tensors in module-level caches
    (transformers' ESMFold ``rigid_utils`` caches its identity rotations per dtype and device)
    would hand a tensor of an earlier trace's mode to a later one, which torch refuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=False)


def _clear_module_caches(model: nn.Module) -> None:
    """Empty the ``functools`` caches defined in the model's package: a tensor one of them made
    during the fake trace would otherwise be handed to a later real run on the same device
    (transformers' ESMFold ``openfold_utils.rigid_utils`` caches its identity rotations)."""
    package = type(model).__module__.rpartition(".")[0]
    for name, module in list(sys.modules.items()):
        if package and (name == package or name.startswith(package + ".")) and module is not None:
            for value in list(vars(module).values()):
                if hasattr(value, "cache_clear") and getattr(value, "__module__", None) == name:
                    value.cache_clear()


def _fake_converter(fake: Any, device: torch.device):
    conv = fake.fake_tensor_converter

    def to_fake(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.device.type == "meta":
            return conv.from_meta_and_device(fake, t, device)
        return fake.from_tensor(t)
    return to_fake


def trace_inference(model: nn.Module, example_inputs: Any, kwargs: dict | None = None, *,
                    seq_len: int | None = None, on: str = "fake") -> InferenceTrace:
    """Trace one forward of ``model`` under ``torch.no_grad`` (see the module docstring).

    ``example_inputs``: a tensor or a tuple of positional inputs (real or meta: only shapes and
    dtypes are read with ``on="fake"``); ``kwargs`` keyword inputs. ``seq_len``: the sequence
    length, to report the bytes of pair-shaped tensors (two axes of that length) at the peak -
    what :func:`partita.tracing.knobs.sweep_lengths` splits over devices. ``on``: "fake"
    (default, shapes only) or "real" (runs the model on its device: small inputs only)."""
    if on not in ("fake", "real"):
        raise PartitaError(f"trace_inference: on={on!r} is not known; use 'fake' (shapes only) or 'real'")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    kwargs = dict(kwargs or {})
    state = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    weights = sum(_storages(list(state.values())).values())
    inputs = sum(_storages((args, kwargs)).values())
    if on == "fake":
        fake = _fake_mode()
        to_fake = _fake_converter(fake, _device_of(model))
        state, args, kwargs = {k: to_fake(v) for k, v in state.items()}, tree_map(to_fake, args), \
            tree_map(to_fake, kwargs)
        outer = fake
    else:
        outer = nullcontext()
    stack: list[str] = []
    handles = _module_stack(model, stack)
    counter = _LiveBytes(set(_storages((list(state.values()), args, kwargs))), seq_len, stack)
    try:
        with torch.no_grad(), outer, counter:
            out = functional_call(model, state, args, kwargs)
            del out
    except Exception as e:  # noqa: BLE001 - a model that cannot run shape-only: one line, the way out
        if on == "fake" and type(e).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException"):
            raise PartitaError(f"the forward's shapes depend on the data ({e}); trace it with on='real' "
                               f"on a small input") from None
        raise
    finally:
        for h in handles:
            h.remove()
        if on == "fake":
            _clear_module_caches(model)
    return InferenceTrace(weights_bytes=weights, input_bytes=inputs, activation_peak_bytes=counter.peak,
                          peak_at=counter.peak_at, pair_bytes_at_peak=counter.pair_peak, seq_len=seq_len,
                          flops=counter.flops,
                          gemm_flops_by_size=sorted((f, n, p) for (f, p), n in counter.gemms.items()),
                          memory_bytes=counter.memory_bytes, pair_memory_bytes=counter.pair_memory_bytes,
                          ops=counter.ops,
                          data_dependent=counter.data_dependent)
