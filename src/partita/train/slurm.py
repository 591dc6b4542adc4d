"""``partita train --scheduler slurm``: the plan as a Slurm job (issue 34).

The sbatch script is :func:`partita.export.slurm.render_sbatch`'s - the one ``partita export
--to slurm`` writes - so a submitted job and an exported script are the same job: one
``partita train`` per node through ``srun``, a c10d rendezvous on the first node of the
allocation keyed by the job id, the plan's JSON inside. Here the plan is resolved first
(the same checks as a local run, before anything is queued); then

- ``--dry-run`` prints the script;
- inside an allocation (``SLURM_JOB_ID`` set, e.g. under ``salloc``) the script runs in
  this shell: its ``srun`` starts the job's steps on the allocation's nodes;
- otherwise ``sbatch --parsable`` submits it; ``--detach`` prints the job id and returns,
  else the log (``<run dir>/slurm-<job id>.out``: every node's output, rank 0's steps
  among it) is followed until the job leaves the queue and the launcher exits with the
  job's exit status (``scontrol show job``: ``ExitCode=code:signal``). Ctrl-C / SIGTERM
  cancel the job (``scancel``) and the launcher waits for it to leave the queue.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..errors import PartitaError
from .config import LaunchConfig, TrainConfig

#: LaunchConfig fields the script writes itself or that only this launcher reads
_NOT_FORWARDED = {"plan", "nproc", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id", "scheduler", "detach",
                  "dry_run", "partition", "account", "time_limit", "container_image", "max_restarts"}
#: TrainConfig fields written by the script (--device) or derived by each node's launcher
_NOT_FORWARDED_TRAIN = {"device"}


def _flags_of(obj, skip: set[str], command: str = "train") -> list[str]:
    """The ``partita train`` flags that give ``obj``'s non-default values (the reverse of
    :func:`partita.cli.common.add_config_arguments`)."""
    argv: list[str] = []
    for f in dataclasses.fields(obj):
        meta = f.metadata
        if f.name in skip or command not in meta.get("commands", ()) or meta.get("plan_field"):
            continue
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def accelerator(config: TrainConfig) -> str:
    """cpu / cuda / npu: ``--device``, else what this machine has (the nodes are assumed alike)."""
    if config.device in ("cpu", "cuda", "npu"):
        return config.device
    from .worker import detect_device_type
    return detect_device_type(None)


def sbatch_script(config: TrainConfig, launch: LaunchConfig, plan, run_dir: Path) -> str:
    """The job's sbatch script: :func:`partita.export.slurm.render_sbatch` with this run's
    ``partita train`` arguments, the run directory shared by the nodes, and the log in it."""
    from ..export.slurm import SlurmOptions, render_sbatch
    args = _flags_of(config, _NOT_FORWARDED_TRAIN) + _flags_of(dataclasses.replace(launch, run_dir=None),
                                                             _NOT_FORWARDED)
    args += ["--run-dir", str(run_dir)]
    options = SlurmOptions(job_name="partita", time=launch.time_limit, partition=launch.partition,
                           account=launch.account, image=launch.container_image,
                           output=str(run_dir / "slurm-%j.out"), launcher=(sys.executable, "-m", "partita"))
    return render_sbatch(plan, launch.nnodes, launch.nproc, accelerator(config), args, options)


def run_slurm(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> int:
    """Submit (or run inside the allocation) the job and follow it; the exit code is the job's."""
    from .preflight import default_run_dir, writable_dir
    from .resolve import resolve_plan
    run_dir = writable_dir(launch.run_dir or config.checkpoint_dir or default_run_dir(), "--run-dir").resolve()
    if config.checkpoint_dir:
        config = dataclasses.replace(config, checkpoint_dir=str(Path(config.checkpoint_dir).resolve()))
    plan = resolve_plan(config, launch, say)
    script = sbatch_script(config, launch, plan, run_dir)
    if launch.dry_run:
        print(script, end="", flush=True)
        return 0
    path = run_dir / "partita.sbatch"
    path.write_text(script)
    if os.environ.get("SLURM_JOB_ID"):  # inside an allocation: its srun runs the steps
        say(f"partita: inside Slurm allocation {os.environ['SLURM_JOB_ID']}: running {path} here")
        return subprocess.run(["bash", str(path)]).returncode
    try:
        out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise PartitaError("--scheduler slurm: sbatch not found (is this a Slurm login node?)") from None
    if out.returncode:
        raise PartitaError(f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}")
    job = out.stdout.strip().split(";")[0]
    if launch.detach:
        print(job, flush=True)
        say(f"partita: submitted Slurm job {job}; log {run_dir / f'slurm-{job}.out'}; scancel {job} to stop it")
        return 0
    return follow(job, run_dir / f"slurm-{job}.out", say,
                  f"partita: submitted Slurm job {job} ({launch.nnodes} node(s) x {launch.nproc}); following "
                  f"{run_dir / f'slurm-{job}.out'} (Ctrl-C cancels it)")


def _in_queue(job: str) -> bool:
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return True
    return out.returncode == 0 and bool(out.stdout.strip())


def job_exit(job: str) -> tuple[str, int]:
    """(state, exit code) of a job that left the queue: ``scontrol show job`` (kept for
    MinJobAge), else ``sacct``; a job killed by signal N is 128 + N."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=60)
    text = out.stdout
    if out.returncode or "JobState=" not in text:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"], capture_output=True,
                             text=True, timeout=60)
        parts = out.stdout.strip().splitlines()[0].split("|") if out.stdout.strip() else ["UNKNOWN", "1:0"]
        text = f"JobState={parts[0].split()[0]} ExitCode={parts[1]}"
    state = re.search(r"JobState=(\S+)", text)
    code = re.search(r"ExitCode=(\d+):(\d+)", text)
    state_name = state.group(1) if state else "UNKNOWN"
    if code and (int(code.group(1)) or int(code.group(2))):
        return state_name, int(code.group(1)) or 128 + int(code.group(2))
    return state_name, 0 if state_name == "COMPLETED" else 1


def follow(job: str, log: Path, say: Callable[[str], None], first: str = "", poll_s: float = 1.0) -> int:
    """Print the job's log as it grows until the job leaves the queue; Ctrl-C / SIGTERM cancel
    it. The exit code is the job's (130 / 143 when it was cancelled here). ``first`` is said
    once the signal handlers are in place."""
    received: list[int] = []

    def on_signal(signum, frame):
        if not received:
            received.append(signum)
            say(f"partita: cancelling Slurm job {job} (scancel)")
            subprocess.run(["scancel", job], timeout=60)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    if first:
        say(first)  # after the handlers: a Ctrl-C from now on cancels the job
    offset, tail = 0, ""
    try:
        while True:
            gone = not _in_queue(job)
            try:
                with open(log, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                tail = _emit(tail + chunk.decode(errors="replace"))
            except FileNotFoundError:
                pass
            if gone:
                break
            time.sleep(poll_s)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if tail:
        _emit(tail + "\n")
    state, code = job_exit(job)
    if received:
        say(f"partita: Slurm job {job} cancelled ({state})")
        return 128 + received[0]
    say(f"partita: Slurm job {job} {state}, exit status {code}; log {log}")
    return code


def _emit(text: str) -> str:
    """Print the complete lines of ``text`` (a node launcher's ``partita:`` notes to stderr,
    the rest - the plan line, rank 0's steps - to stdout); returns the unfinished last line."""
    *lines, rest = text.split("\n")
    for line in lines:
        stream = sys.stderr if line.startswith("partita: ") or line.startswith("[") else sys.stdout
        print(line, file=stream, flush=True)
    return rest
