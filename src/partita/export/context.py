"""What every exporter is given (its own module so the emitters and the registry import it
without importing each other)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .jobs import JobOptions
    from ..plan import Plan
    from ..spec.hardware import Cluster
    from ..spec.model import ModelSpec


@dataclass(frozen=True)
class ExportContext:
    """The plan, the model and the cluster an export is written for.

    One argument rather than ``(plan, model)`` so that an exporter needing more (a Slurm
    script needs the nodes and devices per node, a Kubernetes manifest the device type) is
    added by one registry entry, without changing the signature of every other exporter.
    ``model`` is None when the user gave no ``--model`` (the exporters then write the
    parallel layout only); ``cluster`` is None when the command has no cluster (``partita
    export`` reads a plan file alone), so an exporter that needs it refuses in one line.
    ``job``: the launch artefacts' settings (job name, time, partition, image, ...; issue 34),
    None for their defaults; the framework configs ignore it.
    """

    plan: Plan
    model: ModelSpec | None = None
    cluster: Cluster | None = None
    job: JobOptions | None = None
