"""``partita export``: a plan as another framework's configuration."""
from __future__ import annotations

import argparse
import sys

from ..errors import PartitaError
from ..export.registry import target_names, targets_help
from ..inputs import check_output_path


def add_parser(sub) -> None:
    exp = sub.add_parser("export", help="write a plan as Megatron-LM / MindSpeed-LLM / DeepSpeed / torchtitan "
                                           "config, or as a Slurm / Kubernetes job (docs/clusters.md)")
    exp.add_argument("--to", required=True, choices=target_names(), help=targets_help())
    exp.add_argument("plan_file", metavar="PLAN", help="a plan file (or the output of plan/estimate --json), its JSON "
                                                       "text, or fields such as tp=2,pp=2,gbs=8")
    exp.add_argument("--model", help="add the model shape (Megatron/MindSpeed) and check the plan against it")
    exp.add_argument("-o", "--output", help="write here instead of stdout")
    _add_job_args(exp)
    exp.set_defaults(func=cmd_export)


def _add_job_args(exp) -> None:
    """The launch artefacts' flags (Slurm script, Kubernetes manifests; docs/clusters.md)."""
    from ..inputs import MAX_DEGREE
    from .types import positive_int
    job = exp.add_argument_group("cluster jobs (--to slurm and the k8s-* manifests)")
    job.add_argument("--hardware", help="the device (partita hardware): GPU, Ascend NPU or cpu; sets the device "
                                        "environment and resources")
    job.add_argument("--devices", type=positive_int(MAX_DEGREE), help="devices in all (default: the plan's)")
    job.add_argument("--nodes", type=positive_int(MAX_DEGREE), help="nodes (default: devices / devices per node)")
    job.add_argument("--devices-per-node", type=positive_int(MAX_DEGREE),
                     help="devices per node (default: the device file's, else devices / nodes)")
    job.add_argument("--job-name", help="the job's name (Slurm job, Kubernetes object, rendezvous id)")
    job.add_argument("--partition", help="Slurm partition")
    job.add_argument("--account", help="Slurm account")
    job.add_argument("--time", help="Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS)")
    job.add_argument("--image", help="container image with partita installed (Slurm: Pyxis --container-image)")
    job.add_argument("--pvc", help="Kubernetes PersistentVolumeClaim shared by the pods: run and checkpoint dirs")
    job.add_argument("--train-args", metavar="ARGS", help='more partita train arguments, one string, e.g. '
                                                          '"--steps 1000 --checkpoint-dir /lustre/me/ckpt"')


def _job_cluster(args: argparse.Namespace, plan):
    """The cluster the job flags name (None without --hardware): devices default to the plan's,
    devices per node to the device file's or devices / --nodes."""
    from ..spec.hardware import make_cluster
    if args.hardware is None:
        given = [f for f, v in (("--nodes", args.nodes), ("--devices", args.devices),
                                ("--devices-per-node", args.devices_per_node)) if v is not None]
        if given:
            raise PartitaError(f"{given[0]} needs --hardware (the device: see `partita hardware`, or cpu)")
        return None
    per_node, devices = args.devices_per_node, args.devices
    if args.nodes is not None:
        if per_node is None:
            total = devices or plan.world_size
            if total % args.nodes:
                raise PartitaError(f"{total} devices do not split over --nodes {args.nodes}; "
                                   f"give --devices-per-node")
            per_node = total // args.nodes
        if devices is not None and devices != args.nodes * per_node:
            raise PartitaError(f"--devices {devices} is not --nodes {args.nodes} x {per_node} devices per node")
        devices = args.nodes * per_node
    return make_cluster(args.hardware, devices or plan.world_size, per_node)


def _job_options(args: argparse.Namespace):
    """The job settings; ``partita train``'s arguments are ``--model`` (as given) and ``--train-args``."""
    import shlex

    from ..export.jobs import JobOptions
    try:
        extra = shlex.split(args.train_args or "")
    except ValueError as e:
        raise PartitaError(f"--train-args {args.train_args!r}: {e}") from None
    train = (["--model", args.model] if args.model else []) + extra
    return JobOptions(name=args.job_name, time=args.time, partition=args.partition, account=args.account,
                      image=args.image, pvc=args.pvc, train_args=tuple(train) if train else None)


def _load_model(name: str | None):
    """The ``--model`` spec, None when the flag is left out. An empty name is refused here: it
    would otherwise read as "no model" and export without the model's shape and checks."""
    from ..spec.load import load_model
    if name is None:
        return None
    if not name.strip():
        raise PartitaError("--model is empty; give a model name (see `partita models`) or a config.json, "
                           "or leave --model out to export the parallel layout only")
    return load_model(name)


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import export
    from ..plan import check
    from .plan_flags import read_plan_arg
    plan = read_plan_arg(args.plan_file, flag="PLAN")
    model = _load_model(args.model)
    check(plan, model)  # the plan's own constraints always; the model's when given
    if args.output is not None:
        check_output_path(args.output, "-o")
    result = export(args.to, plan, model, _job_cluster(args, plan), _job_options(args))
    for w in result.warnings:
        print(f"partita: warning: {w}", file=sys.stderr)
    if args.output:
        from ..outputs import write_output
        write_output(args.output, result.text, "-o")
    else:
        sys.stdout.write(result.text)
    return 0
