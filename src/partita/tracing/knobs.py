"""A model's own memory knobs, searched for the fastest setting that fits; a sweep over lengths.

A **knob** is a setting of the model that trades memory for time without changing its
results - transformers' ``EsmForProteinFolding`` computes its trunk's axial attention in
chunks of ``chunk_size`` rows (``model.trunk.set_chunk_size(n)``; ``None``: no chunking, the
``L x L x L`` triangle-attention logits at once). Declared as :class:`Knob` (a name, candidate
values, how to read and apply it); :func:`knobs_for` finds a model's by its class.
:func:`search` traces the forward (:func:`.inference.trace_inference`, shapes only) at every
combination and keeps the fastest whose peak fits; :func:`sweep` answers, per sequence length,
"fits on one card with which setting, or on how many cards".

**Beyond one card** the model assumed is Dynamic Axial Parallelism (DAP; Cheng et al.,
"FastFold: Reducing AlphaFold Training Time from 11 Days to 67 Hours", arXiv:2203.00854,
sec. 4; also ScaleFold, arXiv:2404.11068): the pair representation ``L x L x c`` and
everything computed from it are split by rows over ``N`` devices, weights and the sequence
track replicated. Per device at the peak:

    weights + (activation peak - pair bytes at the peak) + pair bytes / N + gathered

where *pair bytes* are the live tensors with two axes of length ``L`` at the traced peak and
*gathered* is one full ``L x L x c`` operand: a triangle multiplication ``x_ij = sum_k a_ik
b_jk`` on a device holding rows ``i`` needs every row of ``b``, which DAP all-gathers. Per
trunk block DAP communicates: two all-gathers of that operand (outgoing and incoming
triangle updates) and two all-to-alls of the pair tensor (to column-split for the
ending-node triangle attention and back); each device receives ``(N-1)/N`` of an all-gather's
``L^2 c`` bytes and sends ``(N-1)/N^2`` of them in an all-to-all. Time: the pair-shaped ops'
work divided by ``N`` (:meth:`.inference.InferenceTrace.seconds`), the rest replicated, plus
that traffic at the device's achieved intra-node bandwidth (no overlap). Per-device memory
therefore falls as ``1/N`` only down to the gathered operand - the limit Fold-CP
(arXiv:2603.14806) lifts with a 2-D split, which is not modelled here.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from torch import nn

from ..errors import PartitaError
from ..spec.hardware import Device
from .inference import InferenceTrace, trace_inference

GIB = 2 ** 30


@dataclass(frozen=True)
class Knob:
    """A memory/time setting of a model: ``read(model)`` its value, ``apply(model, value)``."""

    name: str
    values: tuple[Any, ...]  # candidates; every one gives the same results
    read: Callable[[nn.Module], Any]
    apply: Callable[[nn.Module, Any], None]
    doc: str = ""
    #: ``(value, seq_len) -> bool``: whether a value differs from the others at that length (a
    #: chunk at least as long as the sequence is one chunk, the same as any longer one)
    relevant: Callable[[Any, int | None], bool] = lambda value, seq_len: True

    def candidates(self, seq_len: int | None) -> tuple[Any, ...]:
        return tuple(v for v in self.values if self.relevant(v, seq_len))


@dataclass(frozen=True)
class PairSplit:
    """How a model's pair track splits over devices (DAP, see the module docstring)."""

    channels: int  # c of the gathered L x L x c triangle-multiplication operand
    blocks: int  # trunk blocks: each has two all-gathers and two all-to-alls
    dtype_bytes: int = 4


def _esm_read(model: nn.Module) -> Any:
    return model.trunk.chunk_size


def _esm_apply(model: nn.Module, value: Any) -> None:
    model.trunk.set_chunk_size(value)


#: transformers' ESMFold trunk: axial attention in chunks of n rows (modeling_esmfold.py,
#: ``EsmFoldingTrunk.set_chunk_size``: "more or less O(L) instead of O(L^2)" memory).
def _esm_relevant(value: Any, seq_len: int | None) -> bool:
    return value is None or seq_len is None or value < seq_len


ESMFOLD_CHUNK = Knob("trunk.chunk_size", (None, 512, 256, 128, 64, 32, 16, 8), _esm_read, _esm_apply,
                     "ESMFold trunk: axial (triangle) attention computed in chunks of this many rows",
                     _esm_relevant)

#: class name -> its knobs (the first entry: ESMFold)
KNOBS: dict[str, tuple[Knob, ...]] = {"EsmForProteinFolding": (ESMFOLD_CHUNK,)}


def knobs_for(model: nn.Module) -> tuple[Knob, ...]:
    """The declared knobs of ``model``'s class (none: an empty tuple)."""
    return KNOBS.get(type(model).__name__, ())


def pair_split_for(model: nn.Module) -> PairSplit | None:
    """ESMFold's pair track, read from its config (``trunk.pairwise_state_dim``, ``num_blocks``)."""
    trunk = getattr(getattr(getattr(model, "config", None), "esmfold_config", None), "trunk", None)
    if type(model).__name__ != "EsmForProteinFolding" or trunk is None:
        return None
    return PairSplit(channels=trunk.pairwise_state_dim, blocks=trunk.num_blocks)


@dataclass
class Setting:
    """One combination of knob values, its trace and predicted time."""

    values: dict[str, Any]
    trace: InferenceTrace
    seconds: float

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items()) or "(no knobs)"


def limit_bytes(device: Device) -> float:
    """Memory a forward may use on one ``device``: usable memory less the runtime's reserve."""
    return (device.usable_gib - device.runtime_reserved_gib) * GIB


def settings(model: nn.Module, make_inputs: Callable[[], Any], device: Device, knobs: Sequence[Knob] = (),
             seq_len: int | None = None, dtype: str = "fp32") -> list[Setting]:
    """Every combination of the knobs' values traced; the model's own values restored after."""
    before = [k.read(model) for k in knobs]
    out = []
    try:
        for combo in itertools.product(*(k.candidates(seq_len) for k in knobs)):
            for knob, value in zip(knobs, combo):
                knob.apply(model, value)
            trace = trace_inference(model, make_inputs(), seq_len=seq_len)
            trace.knobs = {k.name: v for k, v in zip(knobs, combo)}
            out.append(Setting(dict(trace.knobs), trace, trace.seconds(device, dtype)))
    finally:
        for knob, value in zip(knobs, before):
            knob.apply(model, value)
    return out


def fastest_fitting(found: Sequence[Setting], limit: float) -> Setting | None:
    """The fastest setting whose peak is within ``limit`` bytes (ties: the lower peak)."""
    fits = [s for s in found if s.trace.peak_bytes <= limit]
    return min(fits, key=lambda s: (s.seconds, s.trace.peak_bytes)) if fits else None


def search(model: nn.Module, make_inputs: Callable[[], Any], device: Device, limit: float | None = None,
           knobs: Sequence[Knob] | None = None, seq_len: int | None = None) -> tuple[Setting | None, list[Setting]]:
    """The fastest setting of ``model``'s knobs whose forward fits ``limit`` bytes (default:
    :func:`limit_bytes` of ``device``), and every setting traced."""
    found = settings(model, make_inputs, device, knobs_for(model) if knobs is None else knobs, seq_len)
    return fastest_fitting(found, limit_bytes(device) if limit is None else limit), found


@dataclass
class Split:
    """A setting run over ``devices`` cards by DAP (module docstring)."""

    setting: Setting
    devices: int
    bytes_per_device: float
    seconds: float
    comm_bytes_per_device: float


def dap(setting: Setting, split: PairSplit, n: int, device: Device) -> Split:
    """Per-device memory and time of ``setting`` with the pair track split over ``n`` devices."""
    t = setting.trace
    if n == 1:
        return Split(setting, 1, t.peak_bytes, setting.seconds, 0.0)
    full = float(t.seq_len or 0) ** 2 * split.channels * split.dtype_bytes  # one L x L x c tensor
    memory = t.peak_bytes - t.pair_bytes_at_peak + t.pair_bytes_at_peak / n + full
    comm = split.blocks * (2 * full * (n - 1) / n + 2 * full * (n - 1) / n ** 2)
    bandwidth = device.intra_gbps * 1e9 * device.efficiency.intra_node_comm
    seconds = t.seconds(device, pair_split=n) + comm / bandwidth
    return Split(setting, n, memory, seconds, comm)


@dataclass
class LengthRow:
    """One sequence length of a sweep: the answer and what it rests on."""

    seq_len: int
    best: Split | None  # fastest fitting on the fewest devices (None: not within max_devices)
    default: Setting  # the model's setting as it came (knobs untouched)
    found: list[Setting] = field(default_factory=list)


def sweep(model: nn.Module, make_inputs: Callable[[int], Any], lengths: Sequence[int], device: Device,
          limit: float | None = None, max_devices: int = 64, knobs: Sequence[Knob] | None = None) -> list[LengthRow]:
    """Per length: the fastest knob setting on one card, else the fewest cards under DAP."""
    knobs = knobs_for(model) if knobs is None else tuple(knobs)
    limit = limit_bytes(device) if limit is None else limit
    split = pair_split_for(model)
    rows = []
    for length in lengths:
        if length < 1:
            raise PartitaError(f"sequence length {length} is not positive; give lengths >= 1")
        found = settings(model, lambda: make_inputs(length), device, knobs, length)
        as_is = {k.name: k.read(model) for k in knobs}
        same = [s for s in found if s.values == as_is]
        default = same[0] if same else settings(model, lambda: make_inputs(length), device, (), length)[0]
        best = None
        one = fastest_fitting(found, limit)
        if one is not None:
            best = dap(one, split, 1, device) if split else Split(one, 1, one.trace.peak_bytes, one.seconds, 0.0)
        elif split is not None:
            for n in range(2, max_devices + 1):
                fits = [d for d in (dap(s, split, n, device) for s in found) if d.bytes_per_device <= limit]
                if fits:
                    best = min(fits, key=lambda d: d.seconds)
                    break
        rows.append(LengthRow(length, best, default, found))
    return rows
