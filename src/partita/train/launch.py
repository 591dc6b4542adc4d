"""``partita train``: validate the plan, write it next to the run, start torchrun.

Validation happens here, before any process group exists, so a bad plan costs one line,
not a hung job. torchrun stops every rank when one fails; the workers' process groups
carry a timeout so a lost peer ends in an error rather than a hang, and the launcher
stops a job that logs no step for twice that timeout (:func:`run_watched`).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import PartitaError
from ..plan import Plan, check


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


def cmd_train(args: argparse.Namespace) -> int:
    world = args.nproc * args.nnodes
    defaults = train_defaults(args.device)
    plan_text = args.plan
    from_checkpoint = False
    if args.resume and not plan_text and args.checkpoint_dir:
        plan_text = _checkpoint_plan(args.checkpoint_dir) or ""
        from_checkpoint = bool(plan_text)
    plan = Plan.parse(plan_text, world_size=world, defaults=defaults)
    if from_checkpoint and plan.world_size != world:
        from .replan import describe_change, replan
        new = replan(plan, world, model_spec_for(args.model))
        print(f"partita: the checkpoint's plan ran on {plan.world_size} processes; re-planned for {world} keeping "
              f"global batch {plan.gbs}: {describe_change(plan, new)}", file=sys.stderr)
        plan = new
    spec = model_spec_for(args.model)
    check(plan, spec, world)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita train needs PyTorch: pip install 'partita[runtime]'") from None
    from ..models.llama import build_model
    from ..runtime.parallelize import runtime_check
    runtime_check(plan, build_model(args.model) if args.model.startswith("tiny-") else _Shape(spec))
    if args.data and not os.path.exists(args.data):
        raise PartitaError(f"--data {args.data} does not exist")
    run_dir = args.run_dir or args.checkpoint_dir or tempfile.mkdtemp(prefix="partita-run-")
    os.makedirs(run_dir, exist_ok=True)
    plan_path = os.path.join(run_dir, "plan.json")
    plan.to_json(plan_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}"]
    if args.nnodes > 1 or args.rdzv_endpoint:
        cmd += [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={args.rdzv_endpoint}", f"--rdzv-id={args.rdzv_id}"]
    else:
        cmd += ["--standalone"]
    if args.max_restarts:
        cmd += [f"--max-restarts={args.max_restarts}"]
    cmd += ["-m", "partita.train.worker", "--model", args.model, "--plan", plan_path, "--steps", str(args.steps),
            "--seed", str(args.seed), "--lr", str(args.lr), "--optimizer", args.optimizer,
            "--momentum", str(args.momentum), "--timeout-s", str(args.timeout_s), "--run-dir", run_dir,
            "--lr-schedule", args.lr_schedule, "--warmup-steps", str(args.warmup_steps), "--min-lr", str(args.min_lr),
            "--max-grad-norm", str(args.max_grad_norm), "--keep", str(args.keep)]
    for flag, value in (("--device", args.device), ("--data", args.data), ("--tokenizer", args.tokenizer),
                        ("--checkpoint-dir", args.checkpoint_dir)):
        if value:
            cmd += [flag, value]
    if args.checkpoint_every:
        cmd += ["--checkpoint-every", str(args.checkpoint_every)]
    if args.resume:
        cmd += ["--resume"]
    if args.json:
        cmd += ["--json"]
    elif not args.no_progress:
        cmd += ["--progress"]
    if args.hardware:
        cmd += _prediction_args(spec, plan, args.hardware, world)
    if getattr(args, "profile_dir", None):
        cmd += ["--profile-dir", args.profile_dir]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if not args.json and not getattr(args, "worker_stdout", None):
        print(f"plan: {plan.summary()} (seq {plan.seq_len}, global batch {plan.gbs}, {plan.dtype}); "
              f"{world} process(es); run dir {run_dir}", flush=True)
    returncode, stderr, stalled = run_watched(cmd, env, getattr(args, "worker_stdout", None) or sys.stdout,
                                              Path(run_dir) / "metrics.jsonl", 2 * args.timeout_s)
    if stalled:
        print(f"partita: error: no training step finished in {stalled:.0f} s after the last one: the job is hung "
              f"(a collective that never completes?) and was stopped; raise --timeout-s if steps are this slow",
              file=sys.stderr)
        return 1
    for line in stderr.splitlines():
        if line.startswith("partita: ") and "error" not in line:
            print(line, file=sys.stderr)  # resume / re-plan / skipped-checkpoint messages
    if returncode:
        # show the worker's own error line(s), not torchrun's wrapper traceback
        msg = root_cause(stderr)
        print(msg if msg.startswith("partita: error:") else f"partita: error: a rank failed: {msg}", file=sys.stderr)
        return 2 if "partita: error:" in msg else 1
    return 0


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
    from pathlib import Path

    from ..runtime.checkpoint import complete_checkpoints
    found = complete_checkpoints(checkpoint_dir)
    if not found:
        return None
    meta = json.loads((found[-1][1] / "meta.json").read_text())
    path = Path(checkpoint_dir) / "resume-plan.json"
    path.write_text(json.dumps(meta["plan"]))
    return str(path)


def _prediction_args(spec, plan: Plan, hardware: str, world: int) -> list[str]:
    """The planner's predicted step time and the MFU inputs, for the progress line."""
    from ..estimate import estimate
    from ..spec.hardware import make_cluster
    cluster = make_cluster(hardware, world)
    est = estimate(spec, cluster, plan)
    dtype = "bf16" if plan.dtype in ("bf16", "fp8") else plan.dtype
    return ["--predicted-step-s", repr(est.step_time_s),
            "--model-flops-per-token", repr(spec.model_flops_per_token(plan.seq_len)),
            "--peak-flops", repr(cluster.device.peak_flops(dtype if cluster.device.supports(dtype) else "fp16"))]


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


def add_train_command(sub) -> None:
    p = sub.add_parser("train", help="train a model with a plan (torchrun; gloo on CPU, nccl/hccl on accelerators)")
    _train_args(p)
    p.set_defaults(func=cmd_train)
    prof = sub.add_parser("profile", help="run a plan under torch.profiler and compare with the prediction")
    _train_args(prof)
    prof.add_argument("--profile-dir", help="where the per-rank traces go (default: <run dir>/profile)")
    prof.add_argument("--report", help="also write a self-contained HTML report (timeline + measured vs predicted; "
                                       "needs plotly: partita[report])")
    prof.set_defaults(func=cmd_profile, steps=5)


def cmd_profile(args: argparse.Namespace) -> int:
    from .profile_report import run_profile
    return run_profile(args, cmd_train)


def _train_args(p) -> None:
    p.add_argument("--model", required=True, help="tiny-llama, tiny-moe, a preset or a config.json")
    p.add_argument("--plan", default="", help='"dp=2,tp=2,..." (dp fills the world) or plan.json')
    p.add_argument("--nproc", type=int, default=1, help="processes per node")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default="", help="host:port of the rendezvous (multi-node)")
    p.add_argument("--rdzv-id", default="partita")
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                   help="cosine: linear warm-up then cosine decay to --min-lr")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping over all shards (0: off)")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum")
    p.add_argument("--data", help="text file, directory of .txt/.jsonl, or tokens .npy (default: synthetic)")
    p.add_argument("--tokenizer", help="HF tokenizer.json (default: a byte-level BPE trained on --data)")
    p.add_argument("--checkpoint-dir", help="where checkpoints go")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every N steps")
    p.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--hardware", help="print the planner's prediction and MFU against this device's peak")
    p.add_argument("--no-progress", action="store_true", help="plain lines instead of a progress bar")
    p.add_argument("--device", help="cpu, cuda or npu (default: what the machine has)")
    p.add_argument("--run-dir", help="where the plan and logs go (default: a temp dir)")
    p.add_argument("--timeout-s", type=int, default=300,
                   help="collective timeout per process group; a run with no step for twice this long is stopped")
    p.add_argument("--json", action="store_true", help="one JSON object per step")
