"""Memory rates of an eager runtime's step on a device file with the ``eager_decode`` rates.

Why a module of its own: the serve model prices an eager step's freshly allocated tensors -
a decode step's ``torch.cat`` / ``repeat_kv`` results, a prefill's ``P x P`` attention scores -
by whether their pages are touched for the first time. A file from ``partita calibrate`` with
the ``eager_decode`` section describes a runtime whose host allocator reuses its pages after
the first step, as a serving engine's memory does (it preallocates its KV cache; PyTorch's
caching allocator on an accelerator keeps freed blocks): ``bench/serve_vs_measure.py`` runs its
forwards so (``steady_heap``: glibc's ``M_MMAP_MAX = 0`` and no heap trimming). Under glibc's
defaults whether such a tensor got fresh pages depended on the heap's history, not on the step
(issue 37: decode batch 8 at context 1024 first-touched 0-143 MB a step from run to run at
one shape); with the pages reused, every one of those bytes moves at the read rate.
Measured on the 2-core development VM (14:04 UTC, load 4-11, calibrated file of 12:20): with
the heap steady no decode or prefill step of the bench faulted a page; decode batch 32 at
context 512 134 ms against 133 priced this way (228 with its copies above the 32 MiB mmap cap
priced as first-touched); prefill of 1024 tokens 1178 ms, its score passes at the clone rate
over-priced it by ~190 ms.

Files without the section (every built-in one: accelerators, where the caching allocator
reuses blocks and reads and copies run at one rate) price as before.
"""
from __future__ import annotations

from ..spec.hardware import Device


def reuses_pages(device: Device, eager: bool) -> bool:
    """Whether an eager runtime's step tensors land in reused pages on ``device``: a file with
    the ``eager_decode`` rates (module docstring) and an eager framework."""
    return eager and device.eager_decode is not None


#: elementwise passes over the ``P x P`` scores per head besides the two matmuls and the
#: softmax in ``eager_attention_forward`` (modeling_llama.py): ``* scaling`` reads and writes
#: (2), ``+ attention_mask`` reads and writes (2); the first matmul's write and the second's
#: read are in the matmuls' own time (a GEMM rate is timed with its output written), the
#: softmax at its own measured rate, ``dropout`` in eval returns its input
SCORE_PASSES = 4


def prefill_attention(model, device: Device, tp: int, weight_bytes: float, prompt_len: int) -> float:
    """Seconds of one layer's eager prefill attention on one rank, on a file with the
    ``eager_decode`` rates: the two ``torch.matmul``s over the whole ``P x P`` score matrix,
    masked half included (``2 P^2 heads/tp (d_qk + d_v)`` FLOPs: ``Q K^T`` and ``P V``), at the
    measured ``F.linear`` rate for ``P`` rows (they are batched GEMMs with ``P`` rows,
    ``aten::bmm``, not a flash kernel: at P = 1024 torch's profiler put them at 33 GFLOP/s
    against ``mm``'s 36 on the development VM, the file's flash-attention rate 24), the softmax's ``heads/tp x P^2``
    elements at the measured softmax rate (where the file has one; else two passes at the read
    rate), and :data:`SCORE_PASSES` passes plus one read of the ``P x P`` mask at the read rate
    (pages reused: :func:`reuses_pages`)."""
    p, heads = float(prompt_len), model.heads / tp
    d_qk, d_v = model.q_dim // model.heads, model.attn_out_dim // model.heads
    matmuls = 2 * p * p * heads * (d_qk + d_v) / device.eager_decode.gemm_flops_per_s(p)
    elements = p * p * heads
    soft = device.eager_decode.softmax_elems_per_s
    read = device.read_bytes_per_s()
    softmax = elements / soft if soft > 0 else 2 * elements * 4 / read  # fp32 scores: 4 bytes
    return matmuls + softmax + p * p * weight_bytes * (heads * SCORE_PASSES + 1) / read


def prefill_layer(cost, device: Device, tokens: float, eager: bool) -> float:
    """Seconds of one layer's forward (``cost``: :func:`partita.cost.compute.layer_forward`'s
    :class:`~partita.cost.compute.LayerCost`) over ``tokens`` rows: as the training model
    prices it, except where :func:`reuses_pages`, whose file measured ``F.linear`` at a
    prefill's row counts (``eager_decode.gemm_gflops_by_rows`` up to 1024 rows): its GEMMs at
    that rate for ``tokens`` rows instead of the calibrated curve, one rate per GFLOP fitted over
    square and wide shapes (30.7 GFLOP/s on the development VM's file of 12:20 UTC, where ``mm``
    at a 256- / 1024-token prefill's shapes ran at 35-36 under torch's profiler, issue 37)."""
    if not reuses_pages(device, eager) or device.eager_decode.gemm_by_rows[-1][0] < 256:
        return cost.time
    return cost.time - cost.gemm_time + cost.gemm_flops / device.eager_decode.gemm_flops_per_s(tokens)
