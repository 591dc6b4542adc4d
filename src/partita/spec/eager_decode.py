"""The ``eager_decode`` section of a device file: rates of an eager decode step's kernels.

Why a section of its own: a decode step run eagerly (transformers' own forward, no captured
graph, no fused paged attention - the ``partita`` serving framework) spends its time in kernels
the training cost model never meets at these shapes, each measured by ``partita calibrate``
(:mod:`partita.calibrate.decode_rates`) on the machine:

* ``gemm_gflops_by_rows``: ``{rows: GFLOP/s}`` of ``F.linear`` with few rows (a decode step's
  GEMMs have ``M`` = the batch): on the 2-core development VM 7 GFLOP/s at one row, 12 at 8,
  21 at 32 - below the calibrated square-GEMM curve, which is one rate per GFLOP whatever the
  shape;
* ``attention_tbps``: bytes of K and V per second through eager attention at a query length of
  one (``matmul`` of the query with K^T, ``softmax``, ``matmul`` with V: 64-256 small GEMVs),
  0.55-0.65 of the streaming read rate on that VM;
* ``host_us_per_layer`` and ``host_us_per_step`` (optional, 0 where transformers was not
  installed when calibrating): the host time of an eager decode step of a hidden-64 Llama
  (compute negligible), per decoder layer and per step outside the layers (embedding, rotary
  tables, mask, final norm, logits, the cache's bookkeeping): on that VM ~1.5 ms and ~1.3 ms;
* ``softmax_gelems`` (optional, 0 where not measured): G elements/s of ``torch.softmax`` in fp32
  over rows of 1024 (eager prefill attention's ``P x P`` scores): on that VM the softmax is
  bound by its ``exp``, not by memory - at P = 1024 ~21 ms a layer against 5 ms for its two
  passes at the read rate (torch's profiler, issue 37).

Absent (every built-in file, and files calibrated before the section existed): the serving
model prices these as before (:mod:`partita.serve.latency`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import PartitaError


@dataclass(frozen=True)
class EagerDecode:
    """Measured rates of an eager decode step (module docstring)."""

    #: (rows, FLOP/s), rows ascending
    gemm_by_rows: tuple[tuple[int, float], ...]
    #: bytes of K + V per second through eager attention at q_len 1
    attention_bytes_per_s: float
    #: host seconds of an eager decode step per decoder layer (0: not measured)
    host_s_per_layer: float = 0.0
    #: host seconds of an eager decode step outside its layers (0: not measured)
    host_s_per_step: float = 0.0
    #: elements per second of fp32 softmax over rows of 1024 (0: not measured)
    softmax_elems_per_s: float = 0.0

    def gemm_flops_per_s(self, rows: float) -> float:
        """FLOP/s of a GEMM with ``rows`` rows: linear in ``log rows`` between the measured row
        counts (the rate grows with the rows a weight tile is reused for), the end values beyond."""
        points = self.gemm_by_rows
        if rows <= points[0][0]:
            return points[0][1]
        for (m0, r0), (m1, r1) in zip(points, points[1:]):
            if rows <= m1:
                w = math.log(rows / m0) / math.log(m1 / m0)
                return r0 + w * (r1 - r0)
        return points[-1][1]


#: the keys of the section
_KEYS = ("gemm_gflops_by_rows", "attention_tbps", "host_us_per_layer", "host_us_per_step", "softmax_gelems")


def parse_eager_decode(raw: Any, source: str) -> EagerDecode | None:
    """The file's ``eager_decode`` object, checked; None where the file has none."""
    if raw is None:
        return None
    where = f"hardware file {source}: eager_decode"
    if not isinstance(raw, dict) or set(raw) - set(_KEYS):
        raise PartitaError(f"{where} must be an object with keys among {', '.join(_KEYS)}, got {raw!r}"[:300])
    table = raw.get("gemm_gflops_by_rows")
    att = raw.get("attention_tbps")
    try:
        rows = sorted((int(m), float(r)) for m, r in table.items())
    except (AttributeError, TypeError, ValueError):
        rows = []
    if not rows or any(m < 1 or not (math.isfinite(r) and r > 0) for m, r in rows):
        raise PartitaError(f"{where}.gemm_gflops_by_rows must map row counts >= 1 to GFLOP/s > 0, "
                           f"e.g. {{\"1\": 7.0, \"8\": 12.0}}, got {table!r}"[:300])
    if isinstance(att, bool) or not isinstance(att, (int, float)) or not (math.isfinite(att) and att > 0):
        raise PartitaError(f"{where}.attention_tbps must be a number of TB/s > 0, got {att!r}")
    host = {}
    for key in ("host_us_per_layer", "host_us_per_step"):
        v = raw.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise PartitaError(f"{where}.{key} must be a number of microseconds >= 0, got {v!r}")
        host[key] = float(v) * 1e-6
    soft = raw.get("softmax_gelems", 0.0)
    if isinstance(soft, bool) or not isinstance(soft, (int, float)) or not (math.isfinite(soft) and soft >= 0):
        raise PartitaError(f"{where}.softmax_gelems must be a number of G elements/s >= 0, got {soft!r}")
    return EagerDecode(tuple((m, r * 1e9) for m, r in rows), float(att) * 1e12,
                       host["host_us_per_layer"], host["host_us_per_step"], float(soft) * 1e9)
