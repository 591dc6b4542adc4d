"""What ``partita profile`` reports: a plan run for a few steps under torch.profiler on
every rank (:mod:`partita.cli.profile` starts it), its measured breakdown beside the
planner's prediction.

Measured (per rank, from its trace; :mod:`partita.analyze.breakdown`): step time, compute,
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

import json
import statistics
from pathlib import Path

from ..errors import PartitaError
from .config import PLAN_FILE


def runtime_plan(run_dir: Path):
    """The plan of a run dir as Partita's runtime ran it: predicted with the runtime's own
    framework entry (``framework=partita``), whatever framework the plan was planned for -
    the run dir's steps are Partita's, so Megatron's overlap or fused kernels would not fit."""
    from ..plan import Plan
    from ..calibrate.fit import RUNTIME_FRAMEWORK
    return Plan.load(Path(run_dir) / PLAN_FILE).with_(framework=RUNTIME_FRAMEWORK)


def analyze_run(profile_dir: Path, run_dir: Path, model_name: str, hardware: str) -> tuple[dict, dict]:
    """The report (per rank, overall, predicted, ratios) and each rank's timeline intervals,
    from the traces in ``profile_dir`` and the plan in ``run_dir`` (predicted as Partita's
    runtime runs it: :func:`runtime_plan`)."""
    from ..estimate import estimate
    from ..analyze.breakdown import analyze_trace
    from ..spec.hardware import OPTIONAL_EFFICIENCY_FIELDS, make_cluster
    from ..spec.load import load_model
    plan = runtime_plan(run_dir)
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
    model = load_model(model_name)
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
