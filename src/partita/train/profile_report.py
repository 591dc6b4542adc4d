"""``partita profile``: run a plan for a few steps under torch.profiler on every rank,
then put the measured breakdown beside the planner's prediction.

Measured (per rank, from its trace; :mod:`partita.profile.trace`): step time, compute,
communication by collective, overlapped and exposed communication, idle time (pipeline
bubbles and waits show up here), and memory (allocated vs reserved and the
fragmentation ratio on CUDA/NPU; peak RSS on CPU). Predicted: the estimate of the same
plan on ``--hardware`` (default: the ``cpu`` device file when running on CPU; calibrate
it for your machine). Communication is reported by collective and by mesh axis: on
accelerators the process group each collective names (c10d's record_param_comms /
NCCL kernel arguments) is compared with the plan's tp/cp/ep/dp/pp groups of the rank;
gloo records no group, so the worker marks each group's threads with a few tiny
collectives in a ``partita:group:<axis>`` annotation that the analysis leaves out.
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
    if args.report:
        from ..profile.html_report import require_plotly
        require_plotly()
    hardware = args.hardware or "cpu"
    args.hardware = None  # the worker needs no prediction flags; we print it here
    quiet = args.json
    args.json = True  # the per-step lines go to the metrics file, not the screen
    args.worker_stdout = subprocess.DEVNULL
    code = cmd_train(args)
    if code:
        return code
    report, timelines = analyze_run(Path(args.profile_dir), args, hardware)
    if args.report:
        from ..profile.html_report import write_html_report
        report["html_report"] = str(write_html_report(report, timelines, args.report))
    if quiet:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


def analyze_run(profile_dir: Path, args: argparse.Namespace, hardware: str) -> tuple[dict, dict]:
    """The report (per rank, overall, predicted, ratios) and each rank's timeline intervals."""
    from ..estimate import estimate
    from ..plan import Plan
    from ..profile.trace import analyze_trace
    from ..spec.hardware import OPTIONAL_EFFICIENCY_FIELDS, make_cluster
    from ..spec.model import load_model
    plan = Plan.load(Path(args.run_dir) / "plan.json")
    ranks = []
    timelines: dict[int, dict] = {}
    for trace in sorted(profile_dir.glob("rank*.json")):
        if trace.name.endswith(".summary.json"):
            continue
        r = int(trace.stem[4:])
        b = analyze_trace(trace)
        timelines[r] = b.timeline
        summary = json.loads((profile_dir / f"rank{r}.summary.json").read_text())
        steps = max(b.steps, 1)
        ranks.append({"rank": r, "step_time_s": b.window_us / steps / 1e6, "compute_s": b.compute_us / steps / 1e6,
                      "communication_s": b.communication_us / steps / 1e6,
                      "exposed_communication_s": b.exposed_communication_us / steps / 1e6,
                      "overlapped_s": b.overlapped_us / steps / 1e6, "idle_s": b.idle_us / steps / 1e6,
                      "by_collective_s": {k: v / steps / 1e6 for k, v in b.by_collective_us.items()},
                      "by_axis_s": ({k: v / steps / 1e6 for k, v in b.by_axis_us.items()} if b.by_axis_us else
                                    by_axis(plan, r, {k: v / steps / 1e6 for k, v in b.by_group_us.items()})),
                      "memory": {k: v for k, v in summary.items() if k.startswith(("peak", "frag"))}})
    if not ranks:
        raise PartitaError(f"no traces in {profile_dir}")
    model = load_model(args.model)
    est = estimate(model, make_cluster(hardware, plan.world_size), plan)
    # the host-side framework time (DTensor, FSDP hooks) the cost model books under tp and
    # ZeRO-3 runs as ops on the training thread, which a trace counts as compute
    no_framework = {"efficiency": {k: 0.0 for k in OPTIONAL_EFFICIENCY_FIELDS}}
    framework = est.step_time_s - estimate(model, make_cluster(hardware, plan.world_size, overrides=no_framework),
                                           plan).step_time_s
    comm_parts = [k for k in est.time.parts if "communication" in k or "all-to-all" in k or "send" in k
                  or "sync" in k or "gather" in k]
    predicted = {"step_time_s": est.step_time_s,
                 "compute_s": est.time.parts.get("compute", 0.0) + est.time.parts.get("recompute", 0.0) + framework,
                 "exposed_communication_s": max(sum(est.time.parts[k] for k in comm_parts) - framework, 0.0),
                 "framework_s": framework,
                 "idle_s": est.time.parts.get("pipeline bubble", 0.0),
                 "peak_memory_gib": est.peak_memory_gib}
    overall = {k: statistics.mean(r[k] for r in ranks) for k in
               ("step_time_s", "compute_s", "communication_s", "exposed_communication_s", "overlapped_s", "idle_s")}
    overall["step_time_s"] = max(r["step_time_s"] for r in ranks)
    return {"plan": plan.summary(), "hardware": hardware, "ranks": ranks, "overall": overall, "predicted": predicted,
            "ratio_measured_over_predicted": {k: overall[k] / predicted[k] for k in
                                              ("step_time_s", "compute_s", "exposed_communication_s", "idle_s")
                                              if predicted.get(k)}}, timelines


def axis_of_group(plan, rank: int, group: str) -> str:
    """The mesh axis whose group (containing ``rank``) has exactly these ranks: tp, cp,
    ep, dp, pp or dp_cp; "world" for all ranks; else the ranks themselves."""
    from ..plan import axis_ranks, axis_size
    members = sorted(int(x) for x in group.split(","))
    for axis in ("tp", "cp", "ep", "dp", "pp", "dp_cp"):
        if axis_size(plan, axis) > 1 and sorted(axis_ranks(plan, axis, rank)) == members:
            return axis
    if members == list(range(plan.world_size)):
        return "world"
    return f"ranks {group}"


def by_axis(plan, rank: int, by_group_s: dict[str, float]) -> dict[str, float]:
    """Communication time per mesh axis (groups named by :func:`axis_of_group`)."""
    out: dict[str, float] = {}
    for group, seconds in by_group_s.items():
        axis = axis_of_group(plan, rank, group)
        out[axis] = out.get(axis, 0.0) + seconds
    return out


def print_report(report: dict) -> None:
    from rich.table import Table
    from ..report import make_console
    console = make_console()
    console.print(f"[bold]profile[/bold] {report['plan']}  (prediction: hardware '{report['hardware']}')")
    t = Table(title="Per rank, per step", title_justify="left")
    for col in ("rank", "step", "compute", "comm", "overlapped", "exposed comm", "idle", "collectives", "by axis",
                "memory"):
        t.add_column(col, justify="right" if col not in ("collectives", "by axis", "memory") else "left")
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    for r in report["ranks"]:
        coll = ", ".join(f"{k} {ms(v)}" for k, v in r["by_collective_s"].items())
        axes = ", ".join(f"{k} {ms(v)}" for k, v in r.get("by_axis_s", {}).items()) or "-"
        mem = ", ".join(f"{k} {v:.2f}" for k, v in r["memory"].items())
        t.add_row(str(r["rank"]), ms(r["step_time_s"]), ms(r["compute_s"]), ms(r["communication_s"]),
                  ms(r["overlapped_s"]), ms(r["exposed_communication_s"]), ms(r["idle_s"]), coll, axes, mem)
    console.print(t)
    c = Table(title="Measured vs predicted (per step)", title_justify="left")
    for col in ("", "measured", "predicted", "measured / predicted"):
        c.add_column(col, justify="right")
    o, p, ratio = report["overall"], report["predicted"], report["ratio_measured_over_predicted"]
    for key, label in (("step_time_s", "step time (slowest rank)"), ("compute_s", "compute"),
                       ("exposed_communication_s", "exposed communication"), ("idle_s", "idle / bubble")):
        c.add_row(label, ms(o[key]), ms(p[key]), f"{ratio[key]:.2f}" if key in ratio else "-")
    console.print(c)
    if report["hardware"] == "cpu":
        console.print("prediction on the uncalibrated 'cpu' device file: `partita calibrate --nproc N -o my-cpu.json`, "
                      "then `--hardware my-cpu.json`, measures this machine at this process count")
    if report.get("html_report"):
        console.print(f"HTML report: {report['html_report']}")
