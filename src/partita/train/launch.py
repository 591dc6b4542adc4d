"""Start a training run: validate the plan, write the run directory, watch torchrun.

Validation happens here, before any process group exists, so a bad plan costs one line,
not a hung job. The run directory gets ``plan.json`` (the resolved plan) and
``train.json`` (the :class:`~partita.train.config.TrainConfig`); every worker is started
with just that directory. torchrun stops every rank when one fails; the workers' process
groups carry a timeout so a lost peer ends in an error rather than a hang, and the
launcher stops a job that logs no step for twice that timeout (:func:`run_watched`).
The command line around this is :mod:`partita.cli.train`.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

from ..errors import PartitaError
from ..plan import Plan, check
from .config import PLAN_FILE, LaunchConfig, TrainConfig


def train_defaults(device: str | None) -> dict:
    """Plan fields `partita train` fills when the plan string does not: a fixed global batch
    (so different plans see the same data) and fp32 on CPU (bf16 on accelerators)."""
    on_cpu = (device or "cpu") == "cpu" and not _has_accelerator()
    return {"gbs": 8, "seq_len": 64, "mbs": 1, "dtype": "fp32" if on_cpu else "bf16"}


def _has_accelerator() -> bool:
    try:
        from ..runtime.device import detect_device_type
        return detect_device_type() != "cpu"
    except Exception:  # torch missing: the worker will say so
        return False


def model_spec_for(name: str):
    from ..spec.model import load_model
    return load_model(name)


class PreparedRun(NamedTuple):
    """A validated run, its directory written, ready to start."""
    plan: Plan
    run_dir: Path
    config: TrainConfig
    command: list[str]
    env: dict[str, str]


def resolve_plan(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> Plan:
    """The plan to run: the user's, or (with --resume and no --plan) the newest checkpoint's,
    re-planned for this world size; checked against the model before any process starts."""
    world = launch.world
    plan_text = launch.plan
    from_checkpoint = False
    if config.resume and not plan_text and config.checkpoint_dir:
        plan_text = _checkpoint_plan(config.checkpoint_dir) or ""
        from_checkpoint = bool(plan_text)
    plan = Plan.parse(plan_text, world_size=world, defaults=train_defaults(config.device))
    spec = model_spec_for(config.model)
    if from_checkpoint and plan.world_size != world:
        from .replan import describe_change, replan
        new = replan(plan, world, spec)
        say(f"partita: the checkpoint's plan ran on {plan.world_size} processes; re-planned for {world} keeping "
            f"global batch {plan.gbs}: {describe_change(plan, new)}")
        plan = new
    check(plan, spec, world)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita train needs PyTorch: pip install 'partita[runtime]'") from None
    from ..models.llama import build_model
    from ..runtime.parallelize import runtime_check
    runtime_check(plan, build_model(config.model) if config.model.startswith("tiny-") else _Shape(spec))
    return plan


def prepare_run(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> PreparedRun:
    """Validate, fill the values the launcher derives (progress bar, prediction), write
    ``plan.json`` and ``train.json`` into the run directory and build torchrun's command."""
    plan = resolve_plan(config, launch, say)
    if config.data and not os.path.exists(config.data):
        raise PartitaError(f"--data {config.data} does not exist")
    run_dir = Path(launch.run_dir or config.checkpoint_dir or tempfile.mkdtemp(prefix="partita-run-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    derived: dict = {"progress": not config.json and not launch.no_progress}
    if launch.hardware:
        derived.update(prediction(model_spec_for(config.model), plan, launch.hardware, launch.world))
    config = dataclasses.replace(config, **derived)
    plan.to_json(run_dir / PLAN_FILE)
    config.save(run_dir)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return PreparedRun(plan, run_dir, config, torchrun_command(launch, run_dir), env)


def torchrun_command(launch: LaunchConfig, run_dir: Path) -> list[str]:
    """torchrun (standalone, or c10d rendezvous across nodes) starting one worker per process."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}"]
    if launch.nnodes > 1 or launch.rdzv_endpoint:
        cmd += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}"]
    else:
        cmd += ["--standalone"]
    if launch.max_restarts:
        cmd += [f"--max-restarts={launch.max_restarts}"]
    return cmd + ["-m", "partita.train.worker", str(run_dir)]


def run_watched(cmd: list[str], env: dict, stdout, metrics: Path, stall_s: float) -> tuple[int, str, float]:
    """Run torchrun and stop it when training stalls: once a first step is logged (rank 0
    appends to ``metrics``), a gap of ``stall_s`` seconds without another ends the job.
    The per-group collective timeout cannot catch every hang (DTensor's functional
    collectives wait outside it; a rank can spin). Returns (exit code, stderr, seconds
    stalled or 0)."""
    import signal
    import threading

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    last_change, last_stat = None, None
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            try:
                stat = metrics.stat()
                seen = (stat.st_size, stat.st_mtime_ns)
            except FileNotFoundError:
                continue
            now = time.monotonic()
            if seen != last_stat:
                last_stat, last_change = seen, now
            elif last_change is not None and now - last_change > stall_s:
                _stop(proc)
                reader.join(timeout=5)
                return proc.returncode, "".join(chunks), now - last_change
    except BaseException:  # Ctrl-C or SIGTERM to the launcher: take the workers down too
        _stop(proc)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    reader.join(timeout=30)
    return proc.returncode, "".join(chunks), 0.0


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM torchrun (it terminates its workers), then SIGKILL it and every process
    below it that is still there - torchrun starts each worker in a session of its own."""
    import signal
    family = _descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _checkpoint_plan(checkpoint_dir: str) -> str | None:
    """Path of a plan JSON holding the newest complete checkpoint's plan, if any."""
    import json

    from ..runtime.checkpoint import complete_checkpoints
    found = complete_checkpoints(checkpoint_dir)
    if not found:
        return None
    meta = json.loads((found[-1][1] / "meta.json").read_text())
    path = Path(checkpoint_dir) / "resume-plan.json"
    path.write_text(json.dumps(meta["plan"]))
    return str(path)


def prediction(spec, plan: Plan, hardware: str, world: int) -> dict[str, float]:
    """The planner's predicted step time and the MFU inputs, for the progress line
    (:class:`TrainConfig` fields)."""
    from ..estimate import estimate
    from ..spec.hardware import make_cluster
    cluster = make_cluster(hardware, world)
    est = estimate(spec, cluster, plan)
    dtype = "bf16" if plan.dtype in ("bf16", "fp8") else plan.dtype
    return {"predicted_step_s": est.step_time_s,
            "model_flops_per_token": spec.model_flops_per_token(plan.seq_len),
            "peak_flops": cluster.device.peak_flops(dtype if cluster.device.supports(dtype) else "fp16")}


def root_cause(stderr: str) -> str:
    """The failing rank's own error line from torchrun's output (not the agent's wrapper)."""
    import re
    lines = stderr.splitlines()
    for line in reversed(lines):
        if "partita: error:" in line:
            return line[line.index("partita: error:"):]
    pattern = re.compile(r"^(\[rank\d+\]:\s*)?[A-Za-z_.]*(Error|Exception|Interrupt): ")
    causes = [l for l in lines if pattern.match(l) and "ChildFailedError" not in l]
    # peers of a dead rank fail too ("Connection closed by peer"); the first error is the cause
    primary = [l for l in causes if "closed by peer" not in l and "Timed out" not in l]
    if primary or causes:
        return (primary or causes)[0]
    return lines[-1] if lines else "unknown error"


class _Shape:
    """Enough of a model for runtime_check when the model is only a spec."""

    def __init__(self, spec):
        from ..models.llama import TransformerConfig
        self.cfg = TransformerConfig(num_experts=spec.moe.num_experts if spec.moe else 0)
