"""Per-collective latency/bandwidth fits a calibrated device file may carry.

``partita calibrate`` times every collective (all-reduce, all-gather, reduce-scatter,
all-to-all, send/recv) at several message sizes and group sizes and fits, per
collective and group size, the alpha-beta model ``t = c_lat(n) alpha + c_bw(n) S / B``
(:mod:`partita.calibrate.fit`). The device file holds them under a top-level
``collectives`` object::

    "collectives": {"all_reduce": [{"group": 2, "latency_us": 980, "gbps": 0.9,
                                    "source": "measured: partita calibrate, ..."}], ...}

and :mod:`partita.cost.comm` uses them, when present, instead of the one
``intra_node`` pair for the part of a collective inside a node. A file without the
object (every built-in device) keeps the datasheet model unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import PartitaError

#: The collectives a fit may be given for (the names :mod:`partita.cost.comm` uses).
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")


@dataclass(frozen=True)
class CollectiveFit:
    """One collective's fitted per-step latency (s) and per-link bandwidth (B/s) on a group of ``group`` ranks."""

    kind: str
    group: int
    latency_s: float
    bandwidth: float
    source: str = "measured: partita calibrate"


def parse_collective_fits(raw: Any, source: str) -> tuple[CollectiveFit, ...]:
    """The ``collectives`` object of a device file as fits, sorted; one-line errors for bad entries."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise PartitaError(f"hardware file {source}: collectives must map a collective to a list of fits, "
                           f"e.g. {{\"all_reduce\": [{{\"group\": 2, \"latency_us\": 50, \"gbps\": 5}}]}}")
    out = []
    for kind, fits in raw.items():
        if kind not in COLLECTIVE_KINDS:
            raise PartitaError(f"hardware file {source}: unknown collective {kind!r}"[:200]
                               + f"; known: {', '.join(COLLECTIVE_KINDS)}")
        if not isinstance(fits, list):
            raise PartitaError(f"hardware file {source}: collectives.{kind} must be a list of "
                               "{group, latency_us, gbps} objects")
        for fit in fits:
            out.append(_one(kind, fit, source))
    return tuple(sorted(out, key=lambda f: (f.kind, f.group)))


def _one(kind: str, fit: Any, source: str) -> CollectiveFit:
    where = f"hardware file {source}: collectives.{kind}"
    if not isinstance(fit, dict):
        raise PartitaError(f"{where} entries must be objects with group, latency_us and gbps, got {fit!r}"[:300])
    group, lat, gbps = fit.get("group"), fit.get("latency_us"), fit.get("gbps")
    if isinstance(group, bool) or not isinstance(group, int) or not 2 <= group <= 1 << 20:
        raise PartitaError(f"{where}: group must be a whole number from 2 to {1 << 20:,}, got {group!r}")
    for name, value, low_open in (("latency_us", lat, False), ("gbps", gbps, True)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0 or (low_open and value == 0) or value > 1e9:
            need = "more than 0" if low_open else "0 or more"
            raise PartitaError(f"{where}: {name} must be a finite number {need} (at most 1e9), got {value!r}")
    return CollectiveFit(kind, group, float(lat) * 1e-6, float(gbps) * 1e9,
                         str(fit.get("source", "measured: partita calibrate")))
