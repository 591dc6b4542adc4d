"""Plan exporters: one module per target framework, listed once in :mod:`.registry`. Each
exporter takes an :class:`ExportContext` (plan, model, cluster) and returns an :class:`Export`
(the config text plus warnings for anything emitted as a closest equivalent), or raises
:class:`partita.errors.PartitaError` when the target cannot express the plan at all."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .context import ExportContext
from .result import Export

if TYPE_CHECKING:
    from .jobs import JobOptions
    from ..plan import Plan
    from ..spec.hardware import Cluster
    from ..spec.model import ModelSpec

__all__ = ["Export", "ExportContext", "export"]


def export(target: str, plan: Plan, model: ModelSpec | None = None, cluster: Cluster | None = None,
           job: JobOptions | None = None) -> Export:
    """``plan`` as ``target``'s configuration (``job``: the settings of a launch artefact, a
    Slurm script or a Kubernetes manifest). Layers that do not divide into pp*vpp stages are
    written with the automatic split the estimate used (Megatron layout, torchtitan first/last),
    so every target runs the stages that were estimated. A plan the framework does not run
    as planned (:func:`partita.search.capabilities.plan_problem`, the table the search reads)
    is still written, its closest equivalent, with that reason as the first warning."""
    from .registry import get_target
    exporter = get_target(target).exporter  # an unknown name fails before any work
    if model is not None and not plan.layer_split:
        from ..plan import automatic_split
        split = automatic_split(model.layers, plan.pp * plan.vpp)
        if split:
            plan = plan.with_(layer_split=split)
    result = exporter(ExportContext(plan, model, cluster, job))
    if model is not None:
        from ..search.capabilities import plan_problem
        problem = plan_problem(target, plan, model)  # the search's table: one answer to "does T run it"
        if problem:
            result.warnings.insert(0, f"{problem}, so {target} will not run this plan as estimated; "
                                      f"`partita plan --framework {target}` proposes only plans it runs")
    return result
