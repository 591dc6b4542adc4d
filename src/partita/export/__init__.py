"""Plan exporters: one module per target framework. Each returns an :class:`Export`
(the config text plus warnings for anything emitted as a closest equivalent) or raises
:class:`partita.errors.PartitaError` when the target cannot express the plan at all."""
from __future__ import annotations

from .result import Export

__all__ = ["Export", "export"]


def export(target: str, plan, model=None, hardware=None) -> Export:
    from .deepspeed import export_deepspeed
    from .megatron import export_megatron, export_mindspeed
    from .torchtitan import export_torchtitan
    from ..errors import PartitaError
    targets = {"megatron": export_megatron, "mindspeed": export_mindspeed, "deepspeed": export_deepspeed,
               "torchtitan": export_torchtitan}
    if target not in targets:
        raise PartitaError(f"unknown export target {target!r}; choose one of {', '.join(targets)}")
    if model is not None and not plan.layer_split:
        # layers that do not divide into pp*vpp stages: the automatic split the estimate
        # used, written out as the plan's own split (Megatron layout, torchtitan first/last)
        from ..plan import automatic_split
        split = automatic_split(model.layers, plan.pp * plan.vpp)
        if split:
            plan = plan.with_(layer_split=split)
    return targets[target](plan, model)
