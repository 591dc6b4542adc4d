"""Collective communication times on a two-level topology (node fabric + network).

A group is described by where its members sit: ``g`` members per node on ``k`` nodes
(:func:`partita.plan.group_span` derives this from the mesh axis order). Sizes follow
the nccl-tests convention: ``S`` is the full buffer (for all-gather / reduce-scatter the
gathered size; for all-to-all the bytes one rank sends including its own slice).

Bandwidth per rank:

* inside a node on a switch (NVSwitch, UB): ``B_intra = intra_gbps * eff``;
* inside a node on a point-to-point full mesh (HCCS, xGMI): each rank drives its
  ``g - 1`` peer links at once, ``B_intra = peer_gbps * (g - 1) * eff`` - so a 2-NPU
  group gets one 28 GB/s link and an 8-NPU group the full 196 GB/s, which is why
  measured 910B all-reduce algbw grows 18 -> 36 -> 72 GB/s for 2/4/8 NPUs
  (HCCL mesh algorithm, docs/reference/hardware.md sec. 3.2);
* between nodes, every device owns a NIC: ``B_inter = inter_gbps * eff``.

Hierarchical all-reduce (HCCL/NCCL two-level: intra reduce-scatter, inter all-reduce of
``S/g``, intra all-gather; hardware.md sec. 3.3)::

    T_AR = 2 (g-1)/g * S / B_intra + 2 (k-1)/k * (S/g) / B_inter + latency

All-gather and reduce-scatter move half of that. Latency: ``2(g-1)`` intra steps
(ring) and ``2 log2(k)`` inter steps (tree/halving-doubling) for an all-reduce.
Known gaps: no congestion between groups sharing a NIC, no NVLS/SHARP in-network
reduction, no message-size dependence of the efficiency beyond the latency term.

Calibrated collectives. A device file ``partita calibrate`` wrote carries, per
collective and group size, a fitted per-step latency ``alpha`` and per-link bandwidth
``B`` (:mod:`partita.spec.collective_fits`). When it has one for a collective, the part
of that collective inside a node is the alpha-beta (Hockney) model with the algorithm's
step and traffic factors [Thakur, Rabenseifner, Gropp 2005, "Optimization of Collective
Communication Operations in MPICH", sec. 4; the same factors as nccl-tests'
PERFORMANCE.md bus bandwidth]::

    ring all-reduce      t = 2(n-1) alpha + 2(n-1)/n S / B
    all-gather, reduce-scatter (ring)     (n-1) alpha +  (n-1)/n S / B
    all-to-all (pairwise, one round)          alpha +  (n-1)/n S / B
    send/recv                                 alpha +          S / B

with the fit of the group size measured nearest to ``n`` (the factors carry it to other
sizes). The fit replaces the intra-node bandwidth, efficiency and latency; the network
part of a group that spans nodes keeps the datasheet model (calibrate measures inside one
node). Without fits (every built-in device) nothing changes.
"""
from __future__ import annotations

import math

from ..spec.collective_fits import CollectiveFit
from ..spec.hardware import Device

#: (latency steps, fraction of ``S`` each rank moves) of each collective on ``n`` ranks
#: [Thakur et al. 2005 sec. 4: ring all-reduce = reduce-scatter + all-gather; nccl-tests
#: PERFORMANCE.md]; :func:`partita.calibrate.fit.fit_collective` fits against the same.
ALGORITHM_FACTORS = {
    "all_reduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n),
    "all_gather": lambda n: (n - 1, (n - 1) / n),
    "reduce_scatter": lambda n: (n - 1, (n - 1) / n),
    "all_to_all": lambda n: (1, (n - 1) / n),
    "send_recv": lambda n: (1, 1.0),
    # binomial tree (Thakur et al. 2005 sec. 4, short messages): ceil(log2 n) steps, S each
    "broadcast": lambda n: (math.ceil(math.log2(n)) if n > 1 else 0, 1.0),
}


def collective_fit(device: Device, kind: str, g: int) -> CollectiveFit | None:
    """The device's fit of ``kind`` measured on the group size nearest ``g`` (ties: the
    larger group), or None when the file has no fit for it."""
    fits = [f for f in device.collective_fits if f.kind == kind]
    if not fits:
        return None
    return min(fits, key=lambda f: (abs(math.log(f.group / g)), -f.group))


def fitted_time(fit: CollectiveFit, kind: str, size: float, n: int) -> float:
    """Alpha-beta time of ``kind`` on ``n`` ranks with the fitted latency and bandwidth."""
    steps, traffic = ALGORITHM_FACTORS[kind](n)
    return steps * fit.latency_s + traffic * size / fit.bandwidth


def intra_bandwidth(device: Device, g: int) -> float:
    """Achievable per-rank bytes/s inside a node for a group of ``g`` members."""
    eff = device.efficiency.intra_node_comm
    if device.intra_topology == "full-mesh":
        return min(device.peer_gbps * max(g - 1, 1), device.intra_gbps) * 1e9 * eff
    return device.intra_gbps * 1e9 * eff


def inter_bandwidth(device: Device) -> float:
    return device.inter_gbps * 1e9 * device.efficiency.inter_node_comm


def _latency(device: Device, g: int, k: int, steps_factor: float) -> float:
    intra = steps_factor * (g - 1) * device.intra_latency_us
    inter = steps_factor * math.ceil(math.log2(k)) * device.inter_latency_us if k > 1 else 0.0
    return (intra + inter) * 1e-6


def all_reduce(device: Device, size: float, g: int, k: int) -> float:
    """Seconds for an all-reduce of ``size`` bytes over ``g`` ranks/node x ``k`` nodes."""
    n = g * k
    if n <= 1 or size <= 0:
        return 0.0
    fit = collective_fit(device, "all_reduce", g) if g > 1 else None
    if fit is not None:
        t = fitted_time(fit, "all_reduce", size, g) + _latency(device, 1, k, 2)
        return t + (2 * (k - 1) / k * (size / g) / inter_bandwidth(device) if k > 1 else 0.0)
    t = 2 * (g - 1) / g * size / intra_bandwidth(device, g) if g > 1 else 0.0
    if k > 1:
        t += 2 * (k - 1) / k * (size / g) / inter_bandwidth(device)
    return t + _latency(device, g, k, 2)


def all_gather(device: Device, size: float, g: int, k: int, kind: str = "all_gather") -> float:
    """All-gather (or reduce-scatter: same traffic) of a ``size``-byte gathered buffer."""
    n = g * k
    if n <= 1 or size <= 0:
        return 0.0
    fit = collective_fit(device, kind, g) if g > 1 else None
    if fit is not None:
        t = fitted_time(fit, kind, size, g) + _latency(device, 1, k, 1)
        return t + ((k - 1) / k * (size / g) / inter_bandwidth(device) if k > 1 else 0.0)
    t = (g - 1) / g * size / intra_bandwidth(device, g) if g > 1 else 0.0
    if k > 1:
        t += (k - 1) / k * (size / g) / inter_bandwidth(device)
    return t + _latency(device, g, k, 1)


def broadcast_call_latency(device: Device, g: int, k: int) -> float:
    """Seconds one broadcast call pays before any byte moves: what every further call adds
    when the same bytes are moved in many calls (a broadcast per parameter tensor). From the
    device's broadcast fit (``partita calibrate`` measures it), else its all-gather fit, else
    the datasheet latency of an all-gather-shaped call (``n - 1`` steps)."""
    if g * k <= 1:
        return 0.0
    for kind in ("broadcast", "all_gather"):
        fit = collective_fit(device, kind, g) if g > 1 else None
        if fit is not None:
            return ALGORITHM_FACTORS[kind](g)[0] * fit.latency_s + _latency(device, 1, k, 1)
    return _latency(device, g, k, 1)


def reduce_scatter(device: Device, size: float, g: int, k: int) -> float:
    """Reduce-scatter of a ``size``-byte full buffer: the all-gather's traffic, its own fit."""
    return all_gather(device, size, g, k, "reduce_scatter")


def all_to_all(device: Device, size: float, g: int, k: int) -> float:
    """All-to-all where each rank sends ``size`` bytes in ``n`` equal slices.

    ``(g-1)/n`` of the bytes stay in the node, ``(n-g)/n`` cross the network; the two
    paths run concurrently, so the slower sets the time. On a full mesh each peer slice
    has its own link. (hardware.md sec. 3.2, direct all-to-all.)
    """
    n = g * k
    if n <= 1 or size <= 0:
        return 0.0
    fit = collective_fit(device, "all_to_all", g) if g > 1 and k == 1 else None
    if fit is not None:  # one node: the fitted pairwise exchange
        return fitted_time(fit, "all_to_all", size, g)
    if device.intra_topology == "full-mesh" and g > 1:
        t_intra = (size / n) / (device.peer_gbps * 1e9 * device.efficiency.intra_node_comm)
    else:
        t_intra = (g - 1) / n * size / intra_bandwidth(device, g) if g > 1 else 0.0
    t_inter = (n - g) / n * size / inter_bandwidth(device) if k > 1 else 0.0
    lat = (device.intra_latency_us + (device.inter_latency_us if k > 1 else 0.0)) * 1e-6
    return max(t_intra, t_inter) + lat


def send_recv(device: Device, size: float, crosses_nodes: bool) -> float:
    """Point-to-point transfer of ``size`` bytes (pipeline activations, ring-attention K/V)."""
    if size <= 0:
        return 0.0
    fit = collective_fit(device, "send_recv", 2) if not crosses_nodes else None
    if fit is not None:
        return fitted_time(fit, "send_recv", size, 2)
    if crosses_nodes:
        return size / inter_bandwidth(device) + device.inter_latency_us * 1e-6
    bw = (device.peer_gbps if device.intra_topology == "full-mesh" else device.intra_gbps) * 1e9
    return size / (bw * device.efficiency.intra_node_comm) + device.intra_latency_us * 1e-6
