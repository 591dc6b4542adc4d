"""One training process, started by torchrun (see launch.py).

Rank 0 prints one line (or JSON object) per step and appends it to the run's metrics
file; checkpoints are written every ``--checkpoint-every`` steps and the newest complete
one is resumed with ``--resume`` or automatically after an elastic restart.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import PartitaError
from ..models.llama import build_model
from ..plan import Plan
from ..runtime.device import backend_for, detect_device_type
from ..runtime.parallelize import parallelize
from .data import PackedTokens, dp_shard, synthetic_batch, tokenize_to_file
from .replan import describe_change, replan
from .schedule import lr_at


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--plan", required=True, help="plan JSON (written by the launcher)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-schedule", choices=["cosine", "constant"], default="constant")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--data")
    p.add_argument("--tokenizer")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--device")
    p.add_argument("--json", action="store_true")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--predicted-step-s", type=float)
    p.add_argument("--model-flops-per-token", type=float)
    p.add_argument("--peak-flops", type=float)
    p.add_argument("--timeout-s", type=int, default=300)
    p.add_argument("--profile-dir", help="record every rank's steps (after the first) with torch.profiler here")
    return p.parse_args(argv)


def init_distributed(device_type: str, timeout_s: int) -> None:
    """Process group per elastic attempt: a PrefixStore per restart keeps a new attempt from
    reading the previous attempt's peer addresses (shared/reference/pytorch_cpu.md F15)."""
    timeout = timedelta(seconds=timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and "MASTER_ADDR" in os.environ:
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
        dist.init_process_group(backend_for(device_type), store=dist.PrefixStore(f"attempt_{attempt}", base),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    else:
        dist.init_process_group(backend_for(device_type), timeout=timeout)


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    """Peak allocated memory on the accelerator, or the process's peak RSS on CPU."""
    if device.type != "cpu":
        module = getattr(torch, device.type)
        return module.max_memory_allocated(device) / 2 ** 30, "allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, "rss"


def _start_profiler(args, device: torch.device, rank: int, steps: int):
    """torch.profiler over all but the first step (warm-up), one Chrome trace per rank."""
    if not args.profile_dir or steps < 2:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    out = Path(args.profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    # on accelerators, record_shapes lets c10d record each collective's process group
    # (record_param_comms "Process Group Ranks"); gloo records none (see _mark_process_groups)
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps - 1),
                   record_shapes=device.type != "cpu", on_trace_ready=lambda p: p.export_chrome_trace(str(out / f"rank{rank}.json")))
    prof.start()
    return prof


def _mark_process_groups(pm) -> None:
    """Name the process groups' worker threads in the trace: gloo runs each group's
    collectives on the group's own threads and records no group, so a few tiny
    all-reduces per group inside a ``partita:group:<axis>`` annotation tie those threads
    to the mesh axis (:func:`partita.profile.trace.analyze_trace` leaves the annotation's
    time out of the step)."""
    groups = [("world", dist.group.WORLD)]
    for axis in ("pp", "dp", "cp", "tp"):
        if pm.mesh[axis].size() > 1:
            groups.append((axis, pm.mesh[axis].get_group()))
    if pm.ep_group is not None:
        groups.append(("ep", pm.ep_group))
    buf = torch.zeros(1, device=pm.device)
    for axis, group in groups:
        with torch.profiler.record_function(f"partita:group:{axis}"):
            for _ in range(4):  # gloo spreads work over its threads; touch each of them
                dist.all_reduce(buf, group=group)


def _write_profile_summary(profile_dir: str, rank: int, device: torch.device, times: list[float]) -> None:
    """Per-rank memory and step times beside the trace (allocator figures where the device has them)."""
    summary: dict = {"rank": rank, "device": device.type, "step_times_s": times}
    if device.type != "cpu":
        module = getattr(torch, device.type)
        summary["peak_allocated_gib"] = module.max_memory_allocated(device) / 2 ** 30
        summary["peak_reserved_gib"] = module.max_memory_reserved(device) / 2 ** 30
        summary["fragmentation"] = 1 - summary["peak_allocated_gib"] / max(summary["peak_reserved_gib"], 1e-9)
    else:
        summary["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    (Path(profile_dir) / f"rank{rank}.summary.json").write_text(json.dumps(summary))


class Metrics:
    """Rank 0's JSON-lines metrics file; on resume, records after the checkpoint are
    discarded (and the discarded steps named) so every step appears exactly once."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled

    def rewind(self, step: int) -> list[int]:
        if not self.enabled or not self.path.exists():
            return []
        kept, dropped = [], []
        for line in self.path.read_text().splitlines():
            rec = json.loads(line)
            if "step" in rec and rec.get("event") is None and rec["step"] > step:
                dropped.append(rec["step"])
            else:
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, self.path)
        return dropped

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device_type = detect_device_type(args.device)
    init_distributed(device_type, args.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    code = 0
    try:
        code = train(args, device_type, rank, world)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr, flush=True)
        code = 2
    if code == 0:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def train(args: argparse.Namespace, device_type: str, rank: int, world: int) -> int:
    from ..runtime.checkpoint import complete_checkpoints, load_checkpoint, save_checkpoint
    run_dir = Path(args.run_dir)
    plan = Plan.load(args.plan)
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)
    resume_from = None
    if ckpt_dir and (args.resume or restarted):
        found = complete_checkpoints(ckpt_dir, report=log)
        if found:
            resume_from = found[-1]
    if plan.world_size != world:
        new = replan(plan, world)
        log(f"partita: world size {plan.world_size} -> {world}: re-planned keeping global batch {plan.gbs}: "
            f"{describe_change(plan, new)}")
        plan = new
    model = build_model(args.model, seed=args.seed)
    vocab = model.cfg.vocab
    if args.optimizer == "sgd":
        make_opt = lambda ps: torch.optim.SGD(ps, lr=args.lr, momentum=args.momentum)  # noqa: E731
    else:
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=args.lr, foreach=False)  # noqa: E731
    pm = parallelize(model, plan, make_optimizer=make_opt, device_type=device_type,
                     max_grad_norm=args.max_grad_norm or None)
    dataset = None
    if args.data:
        if rank == 0:
            token_file = tokenize_to_file(args.data, vocab, str(run_dir), args.tokenizer)
        dist.barrier()
        token_file = tokenize_to_file(args.data, vocab, str(run_dir), args.tokenizer)  # cached: just the path
        dataset = PackedTokens(token_file, plan.seq_len, args.seed, vocab)
    metrics = Metrics(run_dir / "metrics.jsonl", rank == 0)
    start = 0
    if resume_from is not None:
        step_done, path = resume_from
        meta = load_checkpoint(pm, path)
        start = step_done + 1
        dropped = metrics.rewind(step_done)
        rng = meta.get("rng_state")
        if rng:
            torch.set_rng_state(torch.tensor(rng, dtype=torch.uint8))
        log(f"partita: resumed from {path} (step {step_done}, data position {meta.get('data_position')} sequences, "
            f"saved under {Plan.from_dict(meta['plan']).summary()})")
        metrics.write({"event": "resume", "from_step": step_done, "checkpoint": str(path),
                       "discarded_steps": dropped, "plan": plan.summary()})
    progress = None
    if rank == 0 and args.progress and not args.json:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        progress = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeRemainingColumn())
        task = progress.add_task("train", total=args.steps, completed=start, info="")
        progress.start()
    times = []
    last_loss = float("nan")
    profiler = _start_profiler(args, pm.device, rank, args.steps - start)
    for step in range(start, args.steps):
        lr = lr_at(step, args.lr, args.warmup_steps, args.steps, args.min_lr, args.lr_schedule)
        for group in pm.optimizer.param_groups:
            group["lr"] = lr
        if os.environ.get("PARTITA_CRASH_RANK") == str(rank) and step == int(os.environ.get("PARTITA_CRASH_STEP", "1")) \
                and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
            if os.environ.get("PARTITA_CRASH_SIGNAL") == "KILL":
                os.kill(os.getpid(), 9)
            raise RuntimeError(f"injected crash on rank {rank}")
        if os.environ.get("PARTITA_HANG_STEP") == str(step):  # fault injection: every rank stops making progress
            time.sleep(3600)
        t0 = time.perf_counter()
        if dataset is not None:
            x, y = dataset.rank_batch(step, plan, rank)
        else:
            x, y = synthetic_batch(step, plan.gbs, plan.seq_len, vocab, args.seed)
            x, y = dp_shard(x, plan, rank), dp_shard(y, plan, rank)
        loss = pm.train_step(x, y)
        dt = time.perf_counter() - t0
        times.append(dt)
        last_loss = loss
        if rank == 0:
            mem, kind = peak_memory_gib(pm.device)
            record = {"step": step, "loss": loss, "lr": lr, "step_time_s": dt, "tokens_per_s": plan.tokens_per_step / dt,
                      f"peak_mem_{kind}_gib": mem}
            if args.model_flops_per_token and args.peak_flops:
                record["mfu"] = args.model_flops_per_token * plan.tokens_per_step / dt / (args.peak_flops * world)
            if args.predicted_step_s:
                record["predicted_step_time_s"] = args.predicted_step_s
            metrics.write(record)
            if args.json:
                print(json.dumps(record), flush=True)
            elif progress is not None:
                progress.update(task, completed=step + 1,
                                info=f"loss {loss:.4f}  {record['tokens_per_s']:,.0f} tok/s  mem {mem:.2f} GiB"
                                + (f"  MFU {record['mfu']:.1%}" if "mfu" in record else ""))
            else:
                print(f"step {step:5d}  loss {loss:.6f}  lr {lr:.2e}  {dt * 1e3:8.1f} ms  "
                      f"{record['tokens_per_s']:,.0f} tokens/s", flush=True)
        if ckpt_dir and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            meta = {"plan": plan.to_dict(), "model": args.model, "data": args.data,
                    "data_position": (step + 1) * plan.gbs, "seed": args.seed,
                    "scheduler": {"kind": args.lr_schedule, "step": step + 1},
                    "rng_state": torch.get_rng_state().tolist()}
            save_checkpoint(pm, ckpt_dir, step, meta, keep=args.keep)
        if profiler is not None:
            profiler.step()
            if step == start and step + 1 < args.steps:
                _mark_process_groups(pm)  # inside the first recorded step
    if profiler is not None:
        profiler.stop()
        _write_profile_summary(args.profile_dir, rank, pm.device, times)
    if progress is not None:
        progress.stop()
    if rank == 0 and not args.json and times:
        steady = sorted(times[1:] or times)[len(times[1:] or times) // 2]
        line = (f"done: {len(times)} steps, final loss {last_loss:.4f}, median step {steady * 1e3:.1f} ms, "
                f"{plan.tokens_per_step / steady:,.0f} tokens/s")
        if args.predicted_step_s:
            line += f"; predicted {args.predicted_step_s * 1e3:.1f} ms (measured/predicted {steady / args.predicted_step_s:.2f})"
        print(line + f"; metrics in {run_dir / 'metrics.jsonl'}", flush=True)
    return 0


if __name__ == "__main__":
    main()
