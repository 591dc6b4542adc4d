"""``partita profile``: run a plan for a few steps under torch.profiler on every rank,
then put the measured breakdown beside the planner's prediction.

Measured (per rank, from its trace; :mod:`partita.profile.trace`): step time, compute,
communication by collective, overlapped and exposed communication, idle time (pipeline
bubbles and waits show up here), and memory (allocated vs reserved and the
fragmentation ratio on CUDA/NPU; peak RSS on CPU). Predicted: the estimate of the same
plan on ``--hardware`` (default: the ``cpu`` device file when running on CPU; calibrate
it for your machine). gloo traces carry no process-group names, so communication is
reported by collective, not by mesh axis.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from ..errors import PartitaError


def run_profile(args: argparse.Namespace, cmd_train) -> int:
    args.run_dir = args.run_dir or tempfile.mkdtemp(prefix="partita-profile-")
    args.profile_dir = args.profile_dir or str(Path(args.run_dir) / "profile")
    if args.steps < 3:
        raise PartitaError("partita profile needs --steps >= 3 (the first step is a warm-up)")
    hardware = args.hardware or "cpu"
    args.hardware = None  # the worker needs no prediction flags; we print it here
    quiet = args.json
    args.json = True  # the per-step lines go to the metrics file, not the screen
    args.worker_stdout = subprocess.DEVNULL
    code = cmd_train(args)
    if code:
        return code
    report = analyze_run(Path(args.profile_dir), args, hardware)
    if quiet:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


def analyze_run(profile_dir: Path, args: argparse.Namespace, hardware: str) -> dict:
    from ..estimate import estimate
    from ..plan import Plan
    from ..profile.trace import analyze_trace
    from ..spec.hardware import make_cluster
    from ..spec.model import load_model
    plan = Plan.load(Path(args.run_dir) / "plan.json")
    ranks = []
    for trace in sorted(profile_dir.glob("rank*.json")):
        if trace.name.endswith(".summary.json"):
            continue
        r = int(trace.stem[4:])
        b = analyze_trace(trace)
        summary = json.loads((profile_dir / f"rank{r}.summary.json").read_text())
        steps = max(b.steps, 1)
        ranks.append({"rank": r, "step_time_s": b.window_us / steps / 1e6, "compute_s": b.compute_us / steps / 1e6,
                      "communication_s": b.communication_us / steps / 1e6,
                      "exposed_communication_s": b.exposed_communication_us / steps / 1e6,
                      "overlapped_s": b.overlapped_us / steps / 1e6, "idle_s": b.idle_us / steps / 1e6,
                      "by_collective_s": {k: v / steps / 1e6 for k, v in b.by_collective_us.items()},
                      "memory": {k: v for k, v in summary.items() if k.startswith(("peak", "frag"))}})
    if not ranks:
        raise PartitaError(f"no traces in {profile_dir}")
    est = estimate(load_model(args.model), make_cluster(hardware, plan.world_size), plan)
    comm_parts = [k for k in est.time.parts if "communication" in k or "all-to-all" in k or "send" in k
                  or "sync" in k or "gather" in k]
    predicted = {"step_time_s": est.step_time_s,
                 "compute_s": est.time.parts.get("compute", 0.0) + est.time.parts.get("recompute", 0.0),
                 "exposed_communication_s": sum(est.time.parts[k] for k in comm_parts),
                 "idle_s": est.time.parts.get("pipeline bubble", 0.0),
                 "peak_memory_gib": est.peak_memory_gib}
    overall = {k: statistics.mean(r[k] for r in ranks) for k in
               ("step_time_s", "compute_s", "communication_s", "exposed_communication_s", "overlapped_s", "idle_s")}
    overall["step_time_s"] = max(r["step_time_s"] for r in ranks)
    return {"plan": plan.summary(), "hardware": hardware, "ranks": ranks, "overall": overall, "predicted": predicted,
            "ratio_measured_over_predicted": {k: overall[k] / predicted[k] for k in
                                              ("step_time_s", "compute_s", "exposed_communication_s", "idle_s")
                                              if predicted.get(k)}}


def print_report(report: dict) -> None:
    from rich.table import Table
    from ..report import make_console
    console = make_console()
    console.print(f"[bold]profile[/bold] {report['plan']}  (prediction: hardware '{report['hardware']}')")
    t = Table(title="Per rank, per step", title_justify="left")
    for col in ("rank", "step", "compute", "comm", "overlapped", "exposed comm", "idle", "collectives", "memory"):
        t.add_column(col, justify="right" if col not in ("collectives", "memory") else "left")
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    for r in report["ranks"]:
        coll = ", ".join(f"{k} {ms(v)}" for k, v in r["by_collective_s"].items())
        mem = ", ".join(f"{k} {v:.2f}" for k, v in r["memory"].items())
        t.add_row(str(r["rank"]), ms(r["step_time_s"]), ms(r["compute_s"]), ms(r["communication_s"]),
                  ms(r["overlapped_s"]), ms(r["exposed_communication_s"]), ms(r["idle_s"]), coll, mem)
    console.print(t)
    c = Table(title="Measured vs predicted (per step)", title_justify="left")
    for col in ("", "measured", "predicted", "measured / predicted"):
        c.add_column(col, justify="right")
    o, p, ratio = report["overall"], report["predicted"], report["ratio_measured_over_predicted"]
    for key, label in (("step_time_s", "step time (slowest rank)"), ("compute_s", "compute"),
                       ("exposed_communication_s", "exposed communication"), ("idle_s", "idle / bubble")):
        c.add_row(label, ms(o[key]), ms(p[key]), f"{ratio[key]:.2f}" if key in ratio else "-")
    console.print(c)
