"""Host-side framework time per parallel mechanism beyond its collectives: pipeline
schedule per micro-batch, expert dispatch (every MoE layer: the local dispatch, and what
expert parallelism adds on top of it), full recompute and ring attention per layer, and
tensor parallelism without sequence parallelism (its own field, when a file has it).

Like ``tp_framework_us_per_layer`` and ``zero3_framework_us_per_layer``
(:mod:`.step`), each is a device field (default 0: on an accelerator the host runs ahead
of the device and this time hides behind kernels); on a CPU it is on the critical path
and ``partita calibrate`` measures each one directly on a micro-run of Partita's runtime
(:mod:`partita.calibrate.fit`). Booked under the part its mechanism already has
(recompute, cp communication, ep all-to-all, pp send/recv), per micro-batch.
"""
from __future__ import annotations

from typing import NamedTuple

from ..spec.hardware import Device
from .shape import StageShape

#: The forward's share of a layer's forward + backward time (backward = 2 forwards:
#: :data:`partita.cost.step.FORWARD_SHARE`, restated here as step imports this module).
_FORWARD_SHARE = 1 / 3


def tp_framework_us(dev: Device, sp: bool) -> float:
    """Host-side DTensor time per tp layer: ``tp_nosp_framework_us_per_layer`` for tp
    without sequence parallelism when the device file sets it (DTensor redistributes
    differently: replicated activations, all-reduce instead of reduce-scatter/all-gather,
    so calibrate measures it on its own micro-run), else ``tp_framework_us_per_layer`` -
    a file without the field (every built-in device) estimates exactly as before."""
    eff = dev.efficiency
    nosp_set = not dict(eff.provenance).get("tp_nosp_framework_us_per_layer", "default").startswith("default")
    return eff.tp_nosp_framework_us_per_layer if not sp and nosp_set else eff.tp_framework_us_per_layer


def moe_framework_us(dev: Device, ep: bool) -> tuple[float, float]:
    """Host-side expert-dispatch time of one MoE layer (forward + backward, us): ``(local,
    ep)``, the part booked under compute and the part booked under the ep all-to-all.

    A local MoE layer (no ep) runs the router, the token permutation, the loop over its
    experts and the combine: ``moe_framework_us_per_layer``, measured by calibrate on a
    ``dp`` micro-run of tiny-moe. Under ep the same work runs plus the all-to-all dispatch
    and combine bookkeeping: ``ep_framework_us_per_layer`` is what the ``ep=2`` micro-run
    adds on top of a local MoE layer (calibrate fits the moe field first), so an ep layer
    pays ``moe + ep``. A file that does not set the moe field (every built-in device, and
    calibrated files written before it existed, whose ep field is the whole ep-run
    dispatch) keeps the earlier reading: the ep field charged to every MoE layer, under
    the all-to-all with ep and under compute without, so its estimates are unchanged."""
    eff = dev.efficiency
    moe_set = not dict(eff.provenance).get("moe_framework_us_per_layer", "default").startswith("default")
    if not moe_set:
        return (0.0, eff.ep_framework_us_per_layer) if ep else (eff.ep_framework_us_per_layer, 0.0)
    return eff.moe_framework_us_per_layer, (eff.ep_framework_us_per_layer if ep else 0.0)


def add_framework(terms: NamedTuple, dev: Device, shape: StageShape, moe: bool):
    """``terms`` (a :class:`.step.TermsByKind`) with each mechanism's framework time added
    to its layers (dense and MoE) or, for the pipeline, to the per-stage constant."""
    eff = dev.efficiency
    us = 1e-6
    rc = eff.recompute_framework_us_per_layer * us if shape.recompute == "full" else 0.0
    cp = eff.cp_framework_us_per_layer * us if shape.layer.cp > 1 else 0.0
    # expert dispatch (router, permutation, the loop over local experts, combine) is host
    # time every MoE layer pays (compute); ep adds its all-to-all bookkeeping on top
    local, ep_extra = moe_framework_us(dev, shape.layer.ep > 1) if moe else (0.0, 0.0)
    local, ep_extra = local * us, ep_extra * us
    pp = eff.pp_framework_us_per_microbatch * us if shape.pipelined else 0.0
    # tp without sp: the step module booked tp_framework_us_per_layer; a file that measured
    # the no-sp micro-run on its own moves it to that figure (forward + backward, full
    # recompute repeats the forward share)
    tpd = 0.0
    if shape.layer.tp > 1 and not shape.layer.sp:
        repeat = 1 + (_FORWARD_SHARE if shape.recompute == "full" else 0.0)
        tpd = (tp_framework_us(dev, False) - eff.tp_framework_us_per_layer) * us * repeat
    if not (rc or cp or local or ep_extra or pp or tpd):
        return terms

    def layer(t, expert: bool):
        if not t.compute:  # this kind of layer is absent
            return t
        a2a, own = (ep_extra, local) if expert else (0.0, 0.0)
        return t._replace(recompute=t.recompute + rc, cp_comm=t.cp_comm + cp, ep_all_to_all=t.ep_all_to_all + a2a,
                          compute=t.compute + own, backward=t.backward + rc, tp_comm=t.tp_comm + tpd)
    return terms._replace(dense=layer(terms.dense, False), moe=layer(terms.moe, True),
                          per_stage=terms.per_stage._replace(pp_send_recv=terms.per_stage.pp_send_recv + pp))
