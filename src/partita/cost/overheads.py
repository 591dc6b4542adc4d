"""Host-side framework time per parallel mechanism beyond its collectives: pipeline
schedule per micro-batch, expert dispatch (every MoE layer, with or without ep), full recompute and ring attention per layer,
and tensor parallelism without sequence parallelism (its own field, when a file has it).

Like ``tp_framework_us_per_layer`` and ``zero3_framework_us_per_layer``
(:mod:`.step`), each is a device field (default 0: on an accelerator the host runs ahead
of the device and this time hides behind kernels); on a CPU it is on the critical path
and ``partita calibrate`` measures each one directly on a micro-run of Partita's runtime
(:mod:`partita.profile.calibrate_fit`). Booked under the part its mechanism already has
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


def add_framework(terms: NamedTuple, dev: Device, shape: StageShape, moe: bool):
    """``terms`` (a :class:`.step.TermsByKind`) with each mechanism's framework time added
    to its layers (dense and MoE) or, for the pipeline, to the per-stage constant."""
    eff = dev.efficiency
    us = 1e-6
    rc = eff.recompute_framework_us_per_layer * us if shape.recompute == "full" else 0.0
    cp = eff.cp_framework_us_per_layer * us if shape.layer.cp > 1 else 0.0
    # expert dispatch (router, permutation, the loop over local experts, combine) is host
    # time every MoE layer pays, with or without ep: the calibrate micro-run (tiny-moe ep2)
    # measures it there; charged to ep all-to-all under ep, to compute without
    ep = eff.ep_framework_us_per_layer * us if moe else 0.0
    ep_split = shape.layer.ep > 1
    pp = eff.pp_framework_us_per_microbatch * us if shape.pipelined else 0.0
    # tp without sp: the step module booked tp_framework_us_per_layer; a file that measured
    # the no-sp micro-run on its own moves it to that figure (forward + backward, full
    # recompute repeats the forward share)
    tpd = 0.0
    if shape.layer.tp > 1 and not shape.layer.sp:
        repeat = 1 + (_FORWARD_SHARE if shape.recompute == "full" else 0.0)
        tpd = (tp_framework_us(dev, False) - eff.tp_framework_us_per_layer) * us * repeat
    if not (rc or cp or ep or pp or tpd):
        return terms

    def layer(t, expert: bool):
        if not t.compute:  # this kind of layer is absent
            return t
        dispatch = ep if expert else 0.0
        a2a, local = (dispatch, 0.0) if ep_split else (0.0, dispatch)
        return t._replace(recompute=t.recompute + rc, cp_comm=t.cp_comm + cp, ep_all_to_all=t.ep_all_to_all + a2a,
                          compute=t.compute + local, backward=t.backward + rc, tp_comm=t.tp_comm + tpd)
    return terms._replace(dense=layer(terms.dense, False), moe=layer(terms.moe, True),
                          per_stage=terms.per_stage._replace(pp_send_recv=terms.per_stage.pp_send_recv + pp))
