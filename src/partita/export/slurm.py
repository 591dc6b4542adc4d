"""The sbatch script that runs a plan on a Slurm allocation (``partita export --to slurm``; the
renderer :func:`render_sbatch` is also what ``partita train --scheduler slurm`` submits).

The script's shape is the one Megatron-LM, torchtitan and NeMo use for PyTorch on Slurm
(torchtitan's ``multinode_trainer.slurm``, PyTorch's "Multinode training" tutorial,
https://pytorch.org/tutorials/intermediate/ddp_series_multinode.html):

- ``#SBATCH --nodes=N --ntasks-per-node=1``: one task per node, and that task is one
  ``partita train`` which starts one torchrun for the node's ``--nproc`` processes;
- ``--gpus-per-node=P`` on GPUs (https://slurm.schedmd.com/sbatch.html#OPT_gpus-per-node);
  none on CPU; Ascend NPUs are not a Slurm GRES unless the site defines one (``gres``
  option, e.g. ``npu:8``), so an NPU job asks for whole nodes (``--exclusive``);
- the c10d rendezvous is hosted by the first node of the allocation
  (``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1``), keyed by the job id
  (``--rdzv-id $SLURM_JOB_ID``), so the nodes may start in any order and the c10d store
  numbers them (https://pytorch.org/docs/stable/elastic/run.html#note-on-rendezvous-backend);
- ``srun --kill-on-bad-exit=1`` ends the job when one node's launcher fails, rather than
  leaving the others in the rendezvous until it times out;
- a container image runs through Pyxis/enroot (``srun --container-image``,
  ``--container-mounts``, ``--container-workdir``: https://github.com/NVIDIA/pyxis#usage), the
  way NeMo and Megatron-LM's Slurm examples run their containers;
- the device environment (NCCL / HCCL) is :func:`partita.export.jobs.device_env`; on Ascend
  the CANN environment script is sourced where it exists.

The plan is in the script as its JSON text (``PLAN='{...}'``; ``--plan "$PLAN"``), so the
script alone is the job.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import PartitaError
from .context import ExportContext
from .jobs import (ASCEND_SET_ENV, RDZV_PORT, JobOptions, Raw, accelerator_of, check_env, device_env, job_train_args,
                   plan_text, shell_join, train_argv)
from .result import Export

#: Slurm's time formats (https://slurm.schedmd.com/sbatch.html#OPT_time): minutes, M:S, H:M:S,
#: D-H, D-H:M, D-H:M:S, or UNLIMITED
_TIME = re.compile(r"(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite)", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z0-9_.,:+@%/=-]+")


@dataclass(frozen=True)
class SlurmOptions:
    """The job's Slurm settings. None leaves Slurm's (or the site's) default.

    ``image``: a container image for Pyxis (``srun --container-image``), with
    ``container_mounts`` (``SRC:DST[,...]``: the shared run/checkpoint storage) and the
    submit directory as the working directory. ``output``: the log file (Slurm's
    ``%x``/``%j`` patterns). ``rdzv_port``: the rendezvous port on the first node (default:
    29500 + the job id mod 1000, so two jobs sharing a node do not collide). ``rdzv_host``:
    the rendezvous host instead of the first node's name (a site whose node names do not
    resolve). ``launcher``: how ``partita`` is started on the nodes. ``env``: extra
    variables (NCCL_SOCKET_IFNAME, HCCL_SOCKET_IFNAME, ...), written after the device's own
    so they override them."""

    job_name: str = "partita"
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    image: str | None = None
    container_mounts: str | None = None
    output: str | None = "partita-%x-%j.out"
    gres: str | None = None
    cpus_per_task: int | None = None
    rdzv_port: int | None = None
    rdzv_host: str | None = None
    launcher: tuple[str, ...] = ("partita",)
    env: Mapping[str, str] = field(default_factory=dict)


def _check_word(value: str | None, what: str) -> None:
    if value is not None and not _WORD.fullmatch(value):
        raise PartitaError(f"{what} {value!r}: use letters, digits and . , : + @ % / = _ - only")


def check_options(options: SlurmOptions) -> None:
    """One line for a value Slurm would refuse only after the job was queued."""
    if options.time is not None and not _TIME.fullmatch(options.time):
        raise PartitaError(f"--time {options.time!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
    for value, what in ((options.job_name, "job name"), (options.partition, "--partition"),
                        (options.account, "--account"), (options.gres, "gres"), (options.output, "output"),
                        (options.rdzv_host, "rendezvous host")):
        _check_word(value, what)
    if not options.job_name:
        raise PartitaError("the Slurm job name is empty")
    if options.rdzv_port is not None and not 1 <= options.rdzv_port <= 65535:
        raise PartitaError(f"rendezvous port {options.rdzv_port} is not in 1..65535")
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        raise PartitaError(f"cpus per task {options.cpus_per_task} must be positive")
    if not options.launcher:
        raise PartitaError("the launcher of partita on the nodes is empty")


def render_sbatch(plan, nodes: int, devices_per_node: int, accelerator: str, train_args: Sequence[str] = (),
                  options: SlurmOptions | None = None) -> str:
    """The sbatch script running ``plan`` on ``nodes`` nodes of ``devices_per_node`` devices.

    ``accelerator``: ``cuda``, ``npu`` or ``cpu`` (:func:`partita.export.jobs.accelerator_of`
    of a device). ``train_args``: the ``partita train`` arguments other than the launch
    (``--model``, ``--steps``, ``--run-dir``, ``--checkpoint-dir``, ...); the script adds
    ``--plan``, ``--nnodes``, ``--nproc``, ``--device``, ``--rdzv-endpoint`` and
    ``--rdzv-id`` and refuses them in ``train_args``. The plan must fill the allocation."""
    options = options or SlurmOptions()
    check_options(options)
    if accelerator not in ("cuda", "npu", "cpu"):
        raise PartitaError(f"accelerator {accelerator!r}: choose cuda, npu or cpu")
    if nodes < 1 or devices_per_node < 1:
        raise PartitaError(f"a Slurm job needs at least one node and one device per node, got {nodes} x "
                           f"{devices_per_node}")
    if plan.world_size != nodes * devices_per_node:
        raise PartitaError(f"the plan needs {plan.world_size} devices but the job has {nodes} node(s) x "
                           f"{devices_per_node} = {nodes * devices_per_node}; give --nodes/--devices-per-node "
                           f"that multiply to {plan.world_size}")
    env = {**device_env(accelerator, devices_per_node), **check_env(options.env)}
    sb = [f"--job-name={options.job_name}", f"--nodes={nodes}", "--ntasks-per-node=1"]
    if accelerator == "cuda":
        sb.append(f"--gpus-per-node={devices_per_node}")
    if options.gres:
        sb.append(f"--gres={options.gres}")
    elif accelerator == "npu":
        sb.append("--exclusive")
    if options.cpus_per_task:
        sb.append(f"--cpus-per-task={options.cpus_per_task}")
    for name, value in (("time", options.time), ("partition", options.partition), ("account", options.account),
                        ("output", options.output)):
        if value:
            sb.append(f"--{name}={value}")

    lines = ["#!/bin/bash",
             f"# partita: {plan.summary()} on {nodes} node(s) x {devices_per_node} {accelerator}",
             *(f"#SBATCH {s}" for s in sb),
             # no pipefail: `scontrol ... | head -n1` ends scontrol by SIGPIPE on a long node list
             "set -eu", ""]
    if accelerator == "npu" and not options.image:
        lines += ["# the CANN environment (as MindSpeed-LLM's launch scripts)",
                  f"if [ -f {ASCEND_SET_ENV} ]; then set +u; source {ASCEND_SET_ENV}; set -u; fi"]
    if env:
        lines += ["# the device's collective library (see partita.export.jobs for the sources)"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += ["",
              "# the c10d rendezvous runs on the first node of the allocation, keyed by the job id",
              ("RDZV_HOST=" + shlex.quote(options.rdzv_host)) if options.rdzv_host else
              'RDZV_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
              '# its address (NodeAddr: the node name unless the site sets another, as where names do not resolve)\n'
              'RDZV_HOST=$(scontrol show node "$RDZV_NODE" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')\n'
              'RDZV_HOST=${RDZV_HOST:-$RDZV_NODE}',
              'RDZV_HOST=${RDZV_HOST:?no host in SLURM_JOB_NODELIST}',
              f"RDZV_PORT={options.rdzv_port}" if options.rdzv_port else
              f"RDZV_PORT=$(( {RDZV_PORT} + SLURM_JOB_ID % 1000 ))",
              "", "# the plan (partita train --plan reads its JSON text)",
              f"PLAN={shlex.quote(plan_text(plan))}", ""]
    srun = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if options.image:
        srun += [f"--container-image={options.image}", Raw('--container-workdir="$PWD"')]
        if options.container_mounts:
            srun.append(f"--container-mounts={options.container_mounts}")
    argv = train_argv(plan, nodes=nodes, devices_per_node=devices_per_node, accelerator=accelerator,
                      rdzv_endpoint=Raw('"$RDZV_HOST:$RDZV_PORT"'), rdzv_id=Raw('"$SLURM_JOB_ID"'),
                      train_args=train_args,
                      launcher=options.launcher, plan_arg=Raw('"$PLAN"'))
    lines.append(shell_join(srun) + " \\")
    lines.append("  " + shell_join(argv))
    return "\n".join(lines) + "\n"


def export_slurm(ctx: ExportContext, train_args: Sequence[str] | None = None,
                 options: SlurmOptions | None = None) -> Export:
    """``partita export --to slurm``: the sbatch script for the plan on ``ctx.cluster``, running
    ``partita train`` with :func:`~partita.export.jobs.job_train_args`."""
    if ctx.cluster is None:
        raise PartitaError("--to slurm needs the cluster: give --hardware (and --devices or --nodes / "
                           "--devices-per-node)")
    train_args, warnings = job_train_args(ctx, train_args)
    if options is None and ctx.job is not None:
        options = slurm_options(ctx.job)
    cluster = ctx.cluster
    text = render_sbatch(ctx.plan, cluster.nodes, cluster.devices_per_node, accelerator_of(cluster.device),
                         train_args, options)
    return Export("slurm", text, warnings, data={"train_args": list(train_args)})


def slurm_options(job: JobOptions) -> SlurmOptions:
    """The Slurm settings a :class:`~partita.export.jobs.JobOptions` names (the rest default)."""
    given = {"job_name": job.name, "time": job.time, "partition": job.partition, "account": job.account,
             "image": job.image}
    return SlurmOptions(**{k: v for k, v in given.items() if v is not None}, env=dict(job.env))
