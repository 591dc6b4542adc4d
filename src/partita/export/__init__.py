"""Plan exporters: one module per target framework. Each returns an :class:`Export`
(the config text plus warnings for anything emitted as a closest equivalent) or raises
:class:`partita.errors.PartitaError` when the target cannot express the plan at all."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Export:
    target: str
    text: str
    warnings: list[str] = field(default_factory=list)
    data: object = None  # the structured form (argument list, dict) behind ``text``


def export(target: str, plan, model=None, hardware=None) -> Export:
    from .deepspeed import export_deepspeed
    from .megatron import export_megatron, export_mindspeed
    from .torchtitan import export_torchtitan
    from ..errors import PartitaError
    targets = {"megatron": export_megatron, "mindspeed": export_mindspeed, "deepspeed": export_deepspeed,
               "torchtitan": export_torchtitan}
    if target not in targets:
        raise PartitaError(f"unknown export target {target!r}; choose one of {', '.join(targets)}")
    return targets[target](plan, model)
