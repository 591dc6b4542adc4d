"""Host-side framework time per parallel mechanism beyond its collectives: pipeline
schedule per micro-batch, expert dispatch, full recompute and ring attention per layer.

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


def add_framework(terms: NamedTuple, dev: Device, shape: StageShape, moe: bool):
    """``terms`` (a :class:`.step.TermsByKind`) with each mechanism's framework time added
    to its layers (dense and MoE) or, for the pipeline, to the per-stage constant."""
    eff = dev.efficiency
    us = 1e-6
    rc = eff.recompute_framework_us_per_layer * us if shape.recompute == "full" else 0.0
    cp = eff.cp_framework_us_per_layer * us if shape.layer.cp > 1 else 0.0
    ep = eff.ep_framework_us_per_layer * us if shape.layer.ep > 1 and moe else 0.0
    pp = eff.pp_framework_us_per_microbatch * us if shape.pipelined else 0.0
    if not (rc or cp or ep or pp):
        return terms

    def layer(t, expert: bool):
        if not t.compute:  # this kind of layer is absent
            return t
        a2a = ep if expert else 0.0
        return t._replace(recompute=t.recompute + rc, cp_comm=t.cp_comm + cp, ep_all_to_all=t.ep_all_to_all + a2a,
                          backward=t.backward + rc)
    return terms._replace(dense=layer(terms.dense, False), moe=layer(terms.moe, True),
                          per_stage=terms.per_stage._replace(pp_send_recv=terms.per_stage.pp_send_recv + pp))
