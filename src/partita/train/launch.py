"""``partita train``: validate the plan, write it next to the run, start torchrun.

Validation happens here, before any process group exists, so a bad plan costs one line,
not a hung job. torchrun stops every rank when one fails; the workers' process groups
carry a timeout so a lost peer ends in an error rather than a hang.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

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
    plan = Plan.parse(args.plan, world_size=world, defaults=train_defaults(args.device))
    spec = model_spec_for(args.model)
    check(plan, spec, world)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita train needs PyTorch: pip install 'partita[runtime]'") from None
    from ..models.llama import TransformerConfig, build_model
    from ..runtime.parallelize import runtime_check
    runtime_check(plan, build_model(args.model) if args.model.startswith("tiny-") else _Shape(spec))
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="partita-run-")
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
            "--timeout-s", str(args.timeout_s)]
    if args.device:
        cmd += ["--device", args.device]
    if args.json:
        cmd += ["--json"]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if not args.json:
        print(f"plan: {plan.summary()} (seq {plan.seq_len}, global batch {plan.gbs}, {plan.dtype}); "
              f"{world} process(es); plan file {plan_path}", flush=True)
    proc = subprocess.run(cmd, env=env, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        # show the worker's own error line(s), not torchrun's wrapper traceback
        msg = root_cause(proc.stderr)
        print(msg if msg.startswith("partita: error:") else f"partita: error: a rank failed: {msg}", file=sys.stderr)
        return 2 if "partita: error:" in msg else 1
    return 0


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
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--device", help="cpu, cuda or npu (default: what the machine has)")
    p.add_argument("--run-dir", help="where the plan and logs go (default: a temp dir)")
    p.add_argument("--timeout-s", type=int, default=300, help="collective timeout per process group")
    p.add_argument("--json", action="store_true", help="one JSON object per step")
    p.set_defaults(func=cmd_train)
