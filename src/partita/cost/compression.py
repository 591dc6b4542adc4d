"""Data-parallel gradient bytes on the wire, and what each communication knob costs.

The knobs (plan fields, :mod:`partita.plan`):

* ``grad_dtype`` fp32 | bf16 - the dtype the gradients are reduced in. bf16 sends 2
  bytes per gradient element instead of 4 (NeMo/Megatron ``--grad-reduce-in-bf16``;
  FSDP2 ``MixedPrecisionPolicy.reduce_dtype``; DDP ``bf16_compress_hook``, torch docs
  "DDP Communication Hooks"). No extra compute worth modelling (one cast per element).
* ``grad_compression`` powersgd with rank ``r`` [Vogels, Karimireddy, Jaggi 2019,
  "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
  NeurIPS, Algorithm 1] as torch implements it
  (``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``, torch docs "PowerSGD
  Communication Hook"): every gradient viewed as an ``n x m`` matrix (first dim x the
  rest) with ``r' = min(n, m, r)`` is compressed when ``(n + m) r' * 2 < n m`` (torch's
  ``min_compression_rate`` 2); the hook all-reduces ``P = M Q`` (``n r'`` elements) and
  ``Q = M^T P`` (``m r'``) instead of ``n m``; 1-D tensors (norms, biases) and matrices
  not worth it are all-reduced as they are. Wire elements per step::

      sum_compressed r'(n + m) + sum_uncompressed numel

  in the gradient dtype (fp32: the hook compresses the fp32 bucket). Compute per
  compressed matrix: two skinny GEMMs ``M Q`` and ``M^T P`` (``4 n m r'`` FLOPs), the
  error feedback add and copy (reads/writes ``n m`` elements), and the orthogonalisation
  of ``P`` (Gram-Schmidt / QR: ``~2 n r'^2`` FLOPs); the GEMMs are memory-bound at
  small ``r`` (arithmetic intensity ``~r/2`` FLOP/byte), so the time is the larger of
  FLOPs at the GEMM efficiency and ``~5 n m`` element reads/writes at the HBM
  bandwidth. Memory: the error-feedback buffer (one fp32 copy of every gradient the
  hook sees: torch's ``error_dict`` holds the whole bucket) plus the warm-started
  ``P`` and ``Q`` (``p_memory_dict`` / ``q_memory_dict``).

Which tensors are matrices is read from the model spec: per layer q/k/v/o and the MLP
projections (tp splits q/k/v/gate/up by rows and o/down by columns), the embedding and the
output projection; routed experts as one matrix each per projection. Everything else in
the rank's parameter count (norms, biases, router) is sent uncompressed. Known gaps: MLA's
low-rank projections are counted as the standard q/k/v/o shapes; DDP's bucket order and
sizes do not change the byte count (the hook compresses per tensor) and are not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plan import Plan
from ..spec.hardware import Device
from ..spec.model import ModelSpec

#: torch ``PowerSGDState.min_compression_rate`` default: compress a matrix only when
#: that saves more than 2x of its elements.
MIN_COMPRESSION_RATE = 2
#: Element reads/writes per compressed-matrix element per step: error add (read M and
#: error, write M), copy for the new error, ``M Q``, ``M^T P``, the error update.
POWERSGD_ELEMENT_PASSES = 5


@dataclass(frozen=True)
class WireCount:
    """Gradient elements of one rank: as held, and as sent by the knob."""

    elements: float  # gradient elements the data-parallel reduction covers
    wire_elements: float  # elements it sends (PowerSGD: factors + uncompressed tensors)
    compressed_elements: float  # elements of the matrices PowerSGD compresses
    factor_elements: float  # P and Q elements (warm-start memory)
    gemm_flops: float  # PowerSGD's extra FLOPs per step (0 without it)


def layer_matrices(model: ModelSpec, tp: int, moe: bool, ep: int = 1) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of the weight matrices of one layer on a tp rank, as
    ``nn.Linear`` stores them (out x in): column-parallel q/k/v/gate/up split the rows,
    row-parallel o/down the columns [Shoeybi et al. 2019 sec. 3]."""
    h = model.hidden
    mats = [(model.q_dim // tp, h, 1), (model.kv_dim // tp, h, 2), (h, model.attn_out_dim // tp, 1)]
    up = 2 if model.gated else 1
    if moe and model.moe:
        m = model.moe
        local = max(1, m.num_experts // ep)  # routed experts on this ep rank
        mats += [(m.expert_ffn_hidden, h, up * local), (h, m.expert_ffn_hidden, local), (m.num_experts, h, 1)]
        if m.shared_experts:
            f = (m.shared_ffn_hidden or m.expert_ffn_hidden) * m.shared_experts
            mats += [(f // tp, h, up), (h, f // tp, 1)]
    else:
        mats += [(model.ffn_hidden // tp, h, up), (h, model.ffn_hidden // tp, 1)]
    return mats


def rank_matrices(model: ModelSpec, plan: Plan, n_layers: int, n_moe: int, first: bool, last: bool
                  ) -> list[tuple[int, int, int]]:
    """Weight matrices a pipeline rank holds (see :func:`layer_matrices`)."""
    mats = [(r, c, k * (n_layers - n_moe)) for r, c, k in layer_matrices(model, plan.tp, False)] if n_layers > n_moe else []
    if n_moe:
        mats += [(r, c, k * n_moe) for r, c, k in layer_matrices(model, plan.tp, True, plan.ep)]
    v = model.vocab // plan.tp
    if first:
        mats.append((v, model.hidden, 1))
    if last and (not model.tied_embeddings or plan.pp > 1):
        mats.append((v, model.hidden, 1))
    return mats


def powersgd_matrix(rows: int, cols: int, rank: int) -> tuple[bool, int]:
    """(compressed?, elements sent) of one ``rows x cols`` gradient under torch's rule."""
    r = min(rows, cols, rank)
    factors = (rows + cols) * r
    if factors * MIN_COMPRESSION_RATE < rows * cols:
        return True, factors
    return False, rows * cols


def wire_count(model: ModelSpec, plan: Plan, elements: float, n_layers: int, n_moe: int = 0,
               first: bool = True, last: bool = True) -> WireCount:
    """Elements a rank holding ``elements`` gradient elements (this layout's share) sends
    per data-parallel reduction under the plan's knob."""
    if plan.grad_compression != "powersgd":
        return WireCount(elements, elements, 0.0, 0.0, 0.0)
    sent = compressed = factors = flops = 0.0
    for rows, cols, count in rank_matrices(model, plan, n_layers, n_moe, first, last):
        if rows <= 0 or cols <= 0:
            continue
        ok, n = powersgd_matrix(rows, cols, plan.powersgd_rank)
        if ok:
            r = min(rows, cols, plan.powersgd_rank)
            compressed += count * rows * cols
            factors += count * n
            flops += count * (4 * rows * cols * r + 2 * rows * r * r)
    rest = max(0.0, elements - compressed)  # vectors and matrices not worth compressing
    sent = factors + rest
    return WireCount(elements, sent, compressed, factors, flops)


def powersgd_seconds(device: Device, count: WireCount, elem_bytes: int = 4) -> float:
    """Seconds of PowerSGD's own work per step on one rank: the larger of its GEMM FLOPs
    at the device's GEMM efficiency (fp32 hook: the fp32 peak, else bf16) and its
    ``POWERSGD_ELEMENT_PASSES`` passes over the compressed gradients at the HBM
    bandwidth (skinny GEMMs with rank r are memory-bound)."""
    if count.gemm_flops <= 0:
        return 0.0
    peak = device.peak_flops("fp32") if device.supports("fp32") else device.peak_flops("bf16")
    t_flops = count.gemm_flops / (peak * device.efficiency.gemm)
    t_mem = POWERSGD_ELEMENT_PASSES * count.compressed_elements * elem_bytes / (
        device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)
    return max(t_flops, t_mem)


def state_bytes(plan: Plan, count: WireCount, elem_bytes: int = 4) -> float:
    """Memory the knob adds per rank: PowerSGD's error feedback (a copy of every
    gradient it reduces, torch's ``error_dict``) and warm-start factors; 0 otherwise."""
    if plan.grad_compression != "powersgd":
        return 0.0
    return (count.elements + count.factor_elements) * elem_bytes


def reduce_terms(model: ModelSpec, device: Device, plan: Plan, elements: float, shape) -> tuple[float, float]:
    """(wire fraction, PowerSGD seconds) of one rank shape's all-reduce: what
    :func:`partita.cost.step.estimate_step_time` applies to zero-0 gradient bytes."""
    if plan.grad_compression != "powersgd" or elements <= 0:
        return 1.0, 0.0
    c = wire_count(model, plan, elements, shape.n_layers, shape.n_moe, shape.first, shape.last)
    return c.wire_elements / elements, powersgd_seconds(device, c)
