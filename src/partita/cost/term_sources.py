"""Where each part of a step-time estimate gets its numbers: ``calibrated`` (measured on
this machine by ``partita calibrate``), ``measured`` (elsewhere, e.g. nccl-tests), ``datasheet`` (a vendor figure), ``fitted`` (fitted
on published runs), ``scaled``, ``assumed``, ``default``, ``override`` or ``derived`` (the
pipeline bubble: the schedule's formula over the other parts).

A part rests on the device fields listed in :data:`PART_FIELDS` (compute on the GEMM
efficiency and the per-layer overhead; each communication part on its collective and the
framework field booked under it). Its source is the weakest of theirs - a part is only
as calibrated as its least-measured input - and each field's source is listed beside it,
so ``partita estimate --json`` and the breakdown can show "tp communication: calibrated
(all_reduce fit on 2 ranks; tp_framework_us_per_layer calibrated)".
"""
from __future__ import annotations

from ..spec.hardware import Device

#: Provenance kind of a device field -> the word a breakdown prints.
SOURCE_WORD = {"measured": "measured", "vendor": "datasheet", "fitted": "fitted", "scaled": "scaled",
               "assumed": "assumed", "default": "default", "override": "override"}
#: Weakest first: a part with several inputs takes the first of its inputs' words in this order.
_WEAKEST_FIRST = ("assumed", "default", "override", "scaled", "datasheet", "measured", "fitted", "calibrated")
#: Each time part -> (collectives it moves, efficiency fields behind it).
PART_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # a local MoE layer's expert dispatch is booked under compute; ep's share on top of it
    # under the ep all-to-all (cost/overheads.py)
    "compute": ((), ("gemm", "gemm_half_gflop", "memory_bandwidth", "kernel_overhead_us_per_layer",
                     "moe_framework_us_per_layer")),
    "recompute": ((), ("gemm", "recompute_framework_us_per_layer")),
    "optimizer step": ((), ("memory_bandwidth",)),
    "tp communication": (("all_reduce",), ("intra_node_comm", "tp_framework_us_per_layer")),
    "cp communication": (("send_recv",), ("intra_node_comm", "cp_framework_us_per_layer", "comm_overlap")),
    "ep all-to-all": (("all_to_all",), ("intra_node_comm", "ep_framework_us_per_layer")),
    "pp send/recv": (("send_recv",), ("intra_node_comm", "pp_framework_us_per_microbatch")),
    "zero3 gather/scatter": (("all_gather", "reduce_scatter"), ("intra_node_comm", "zero3_framework_us_per_layer",
                                                               "comm_overlap")),
    "dp gradient sync": (("all_reduce", "reduce_scatter"), ("intra_node_comm",)),
    "tied embedding sync": (("all_reduce",), ("intra_node_comm",)),
}
#: The link field a fitted collective replaces (its own fit is then the source).
_LINK_FIELDS = ("intra_node_comm",)


def field_word(device: Device, field: str) -> str:
    """The source word of one efficiency field of ``device``: ``calibrated`` for a figure
    ``partita calibrate`` measured, ``measured`` for one measured elsewhere (nccl-tests...)."""
    text = device.efficiency.source(field)
    kind = text.split(":", 1)[0].strip()
    if kind == "measured" and "partita calibrate" in text:
        return "calibrated"
    return SOURCE_WORD.get(kind, "assumed")


def part_source(device: Device, part: str) -> dict:
    """``{"source": word, "inputs": {input: word}}`` for one time part of an estimate."""
    if part not in PART_FIELDS:
        return {"source": "derived", "inputs": {}}
    collectives, field_names = PART_FIELDS[part]
    inputs: dict[str, str] = {}
    fitted = {f.kind for f in device.collective_fits}
    for kind in collectives:
        if kind in fitted:
            groups = sorted(f.group for f in device.collective_fits if f.kind == kind)
            inputs[f"{kind} fit (groups {', '.join(map(str, groups))})"] = "calibrated"
    for name in field_names:
        if name in _LINK_FIELDS and collectives and all(k in fitted for k in collectives):
            continue  # the collective fits replace the link's bandwidth, efficiency and latency
        if name.endswith(("_per_layer", "_per_microbatch")) and not getattr(device.efficiency, name) \
                and field_word(device, name) == "default":
            continue  # an unset framework field adds nothing
        inputs[name] = field_word(device, name)
    words = set(inputs.values())
    source = next((w for w in _WEAKEST_FIRST if w in words), "derived")
    return {"source": source, "inputs": inputs}


def term_sources(device: Device, parts: dict[str, float]) -> dict[str, dict]:
    """Each part of a step-time breakdown with its source (see :func:`part_source`)."""
    return {part: part_source(device, part) for part in parts}
