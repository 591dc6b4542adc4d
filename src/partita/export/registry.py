"""The one list of export targets: each target's name, exporter, one-line description and
importer (reading the target's config back into a plan).

Every command that names targets (``export --to``, ``plan --export``, ``import --from``) and the
dispatcher :func:`partita.export.export` read :data:`TARGETS`, so a new target (issue 34: Slurm,
Kubernetes) is one entry here: its exporter receives an
:class:`~partita.export.context.ExportContext` (plan, model, cluster) like every other.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import PartitaError
from ..plan import Plan
from ..imports import deepspeed as ds_import, llamafactory as lf_import, megatron as megatron_import, \
    torchtitan as titan_import
from .context import ExportContext
from .deepspeed import export_deepspeed
from .k8s import export_ascendjob, export_pytorchjob, export_trainjob
from .llamafactory import export_llamafactory
from .megatron import export_megatron, export_mindspeed
from .result import Export
from .slurm import export_slurm
from .torchtitan import export_torchtitan


@dataclass(frozen=True)
class ExportTarget:
    """One framework a plan exports to.

    ``importer`` is the library function that reads the target's own config back into a
    :class:`~partita.plan.Plan` (None where there is none); its arguments differ per format
    (an argv list, a ds_config dict), so ``partita import`` prepares them per target.
    """

    name: str
    description: str
    exporter: Callable[[ExportContext], Export]
    importer: Callable[..., Plan] | None = None


TARGETS: tuple[ExportTarget, ...] = (
    ExportTarget("megatron", "Megatron-LM pretrain_gpt.py arguments", export_megatron,
                 megatron_import.plan_from_megatron),
    ExportTarget("mindspeed", "MindSpeed-LLM (Ascend) pretrain_gpt.py arguments: Megatron's with Ascend fused kernels",
                 export_mindspeed, megatron_import.plan_from_megatron),
    ExportTarget("deepspeed", "DeepSpeed ds_config.json", export_deepspeed, ds_import.plan_from_ds_config),
    ExportTarget("torchtitan", "torchtitan 0.3.0 --section.field overrides", export_torchtitan,
                 titan_import.plan_from_torchtitan),
    ExportTarget("llamafactory", "LLaMA-Factory training YAML (fine-tuning: stage, finetuning_type, LoRA, "
                 "DeepSpeed preset)", export_llamafactory, lf_import.plan_from_llamafactory),
    # launch artefacts (issue 34): they need the cluster (nodes, devices per node, device type)
    ExportTarget("slurm", "sbatch script: one partita train per node through srun, c10d rendezvous on the first node",
                 export_slurm),
    ExportTarget("k8s-trainjob", "Kubeflow Trainer v2 TrainJob running partita train on every node", export_trainjob),
    ExportTarget("k8s-pytorchjob", "Kubeflow PyTorchJob running partita train on every node", export_pytorchjob),
    ExportTarget("k8s-ascendjob", "MindCluster AscendJob (Volcano gang scheduling, HCCL rank table) for Ascend NPUs",
                 export_ascendjob),
)


def target_names() -> list[str]:
    """Every target's name, in registry order (the ``choices`` of ``--to`` / ``--export``)."""
    return [t.name for t in TARGETS]


#: Frameworks ``partita import`` reads but Partita does not export to (partita.imports.load reads them by name:
#: nanotron's YAML Config tree, InternEvo's Python config).
IMPORT_ONLY: tuple[str, ...] = ("nanotron", "internevo")


def importable_names() -> list[str]:
    """The targets with an importer, then the import-only frameworks (the ``choices`` of ``import --from``)."""
    return [t.name for t in TARGETS if t.importer is not None] + list(IMPORT_ONLY)


def targets_help() -> str:
    """``name: description`` of every target, for a flag's help text."""
    return "; ".join(f"{t.name}: {t.description}" for t in TARGETS)


def get_target(name: str) -> ExportTarget:
    """The target called ``name``, or a one-line error listing the ones there are."""
    for target in TARGETS:
        if target.name == name:
            return target
    raise PartitaError(f"unknown export target {name!r}; choose one of {', '.join(target_names())}")
