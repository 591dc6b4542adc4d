"""``partita train``: validate the plan, write the run directory, run torchrun, report the outcome.

The flags are generated from :class:`~partita.train.config.TrainConfig` (what the
workers read) and :class:`~partita.train.config.LaunchConfig` (how they are started);
the work is in :mod:`partita.train.resolve` and :mod:`partita.train.supervise`.
"""
from __future__ import annotations

import argparse
import sys

from ..train.config import LaunchConfig, TrainConfig
from .common import add_config_arguments, config_from_args


def add_train_arguments(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of ``partita train`` / ``partita profile``, from the config fields."""
    add_config_arguments(p, TrainConfig, command)
    add_config_arguments(p, LaunchConfig, command)


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model with a plan (torchrun; gloo on CPU, nccl/hccl on accelerators)")
    add_train_arguments(p, "train")
    p.add_argument("--bind-cores", choices=("auto", "on", "off"), default="off",
                   help="on a CPU device, pin each rank to its own share of the cores (on; auto: when the ranks "
                        "are no more than the cores; default off). Accelerators, and --scheduler slurm: bind with the "
                        "launcher's own flags (numactl, srun --cpu-bind)")
    p.set_defaults(func=cmd_train)


def configs_from_args(args: argparse.Namespace) -> tuple[TrainConfig, LaunchConfig]:
    return config_from_args(TrainConfig, args), config_from_args(LaunchConfig, args)


def cmd_train(args: argparse.Namespace) -> int:
    import os

    from ..calibrate.binding import BIND_CORES_ENV
    os.environ[BIND_CORES_ENV] = args.bind_cores  # the workers bind themselves (calibrate/binding.py)
    return run_train(*configs_from_args(args))


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_train(config: TrainConfig, launch: LaunchConfig, worker_stdout=None) -> int:
    if launch.scheduler == "slurm":
        from ..train.slurm import run_slurm
        return run_slurm(config, launch, _say)
    return run_local(config, launch, worker_stdout)


def run_local(config: TrainConfig, launch: LaunchConfig, worker_stdout=None) -> int:
    """Run the job; the workers' stdout goes to ``worker_stdout`` (default: ours). Exit code:
    0 done, 1 a rank failed or the job hung, 2 a user mistake or a refused state (one
    ``partita: error:`` line), 128 + N stopped by signal N (SIGINT 130, SIGTERM 143).
    The checkpoint directory (else the run directory) is locked for the job's life."""
    from ..train.resolve import prepare_run
    from ..train.supervise import remove_torchrun_logs, run_watched
    from ..train.ownership import STOP_FILE, JobLock
    from ..train.preflight import writable_dir
    from .types import check_device_type
    check_device_type(config.device, "--device")  # --device tpu: one line, not a launched job (fuzz_cli)
    for flag, folder in (("--checkpoint-dir", config.checkpoint_dir), ("--run-dir", launch.run_dir)):
        if folder:
            writable_dir(folder, flag)  # a file or an unwritable place: one line, before the lock is taken
    lock_dir = config.checkpoint_dir or launch.run_dir
    lock = JobLock(lock_dir, launch.job_key) if lock_dir else None
    try:
        run = prepare_run(config, launch, _say)
        if lock is None:
            lock = JobLock(run.run_dir, launch.job_key)
        plan = run.plan
        if launch.job_key:
            from ..train.nodes import JOB_KEY
            run.env[JOB_KEY] = launch.job_key
        if not run.config.json and worker_stdout is None:
            print(f"plan: {plan.summary()} (seq {plan.seq_len}, global batch {plan.gbs}, {plan.dtype}); "
                  f"{launch.world} process(es); run dir {run.run_dir}", flush=True)
        else:  # stdout carries one JSON object per step: the run dir goes to stderr
            _say(f"partita: plan {plan.summary()}; {launch.world} process(es); run dir {run.run_dir}")
        outcome = run_watched(run.command, run.env, worker_stdout or sys.stdout, run.run_dir / "metrics.jsonl",
                              2 * run.config.timeout_s, pass_fds=(lock.fd,), grace_s=run.config.timeout_s + 30,
                              say=_say, stop_file=run.run_dir / STOP_FILE, started=waiting(launch, run, _say))
        remove_torchrun_logs(run.run_dir, launch.nnodes)
    except KeyboardInterrupt:  # Ctrl-C while validating / building, before any worker exists
        _say("partita: stopped by SIGINT before the job started")
        return 130
    finally:
        if lock is not None:
            lock.release()
    code = report_outcome(outcome)
    if launch.nnodes > 1:
        from ..train.nodes import job_end_line
        code, line = job_end_line(run.run_dir, code)
        _say(line)
    return code


def waiting(launch: LaunchConfig, run, say):
    """Multi-node: the callback that starts the 'waiting for the other nodes' notes."""
    if launch.nnodes <= 1:
        return None
    from ..train.nodes import watch_rendezvous
    return lambda pid: watch_rendezvous(pid, launch, run.config.timeout_s, say)


def report_outcome(outcome) -> int:
    """Say how the job ended: the hang, the signal, the failing rank's error (the workers'
    ``partita:`` notes were printed while it ran)."""
    import signal

    from ..train.supervise import root_cause
    if outcome.signal:
        name = signal.Signals(outcome.signal).name
        if f"stopped by {name}" not in outcome.stderr:
            _say(f"partita: stopped by {name} before the ranks finished a step")
        return 128 + outcome.signal
    if outcome.stalled:
        _say(f"partita: error: no training step finished in {outcome.stalled:.0f} s after the last one: the job is "
             f"hung (a collective that never completes?) and was stopped; raise --timeout-s if steps are this slow")
        return 1
    if outcome.returncode:
        # the worker's own error line, or the rank that died, not torchrun's wrapper traceback
        msg = root_cause(outcome.stderr)
        _say(msg if msg.startswith("partita: error:") else f"partita: error: {msg}")
        return 2 if msg.startswith("partita: error:") else 1
    return 0
