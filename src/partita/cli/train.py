"""``partita train``: validate the plan, write the run directory, run torchrun, report the outcome.

The flags are generated from :class:`~partita.train.config.TrainConfig` (what the
workers read) and :class:`~partita.train.config.LaunchConfig` (how they are started);
the work is in :mod:`partita.train.launch`.
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
    p.set_defaults(func=cmd_train)


def configs_from_args(args: argparse.Namespace) -> tuple[TrainConfig, LaunchConfig]:
    return config_from_args(TrainConfig, args), config_from_args(LaunchConfig, args)


def cmd_train(args: argparse.Namespace) -> int:
    return run_train(*configs_from_args(args))


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_train(config: TrainConfig, launch: LaunchConfig, worker_stdout=None) -> int:
    """Run the job; the workers' stdout goes to ``worker_stdout`` (default: ours). Exit code:
    0 done, 1 a rank failed or the job hung, 2 a user mistake (one ``partita: error:`` line)."""
    from ..train.launch import prepare_run, run_watched
    run = prepare_run(config, launch, _say)
    if not run.config.json and worker_stdout is None:
        plan = run.plan
        print(f"plan: {plan.summary()} (seq {plan.seq_len}, global batch {plan.gbs}, {plan.dtype}); "
              f"{launch.world} process(es); run dir {run.run_dir}", flush=True)
    returncode, stderr, stalled = run_watched(run.command, run.env, worker_stdout or sys.stdout,
                                              run.run_dir / "metrics.jsonl", 2 * run.config.timeout_s)
    return report_outcome(returncode, stderr, stalled)


def report_outcome(returncode: int, stderr: str, stalled: float) -> int:
    """Say how the job ended: the hang, the workers' ``partita:`` notes, the failing rank's error."""
    from ..train.launch import root_cause
    if stalled:
        _say(f"partita: error: no training step finished in {stalled:.0f} s after the last one: the job is hung "
             f"(a collective that never completes?) and was stopped; raise --timeout-s if steps are this slow")
        return 1
    for line in stderr.splitlines():
        if line.startswith("partita: ") and "error" not in line:
            _say(line)  # resume / re-plan / skipped-checkpoint messages
    if returncode:
        # show the worker's own error line(s), not torchrun's wrapper traceback
        msg = root_cause(stderr)
        _say(msg if msg.startswith("partita: error:") else f"partita: error: a rank failed: {msg}")
        return 2 if "partita: error:" in msg else 1
    return 0
