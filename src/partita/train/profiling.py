"""What a worker records under ``partita profile``: a torch.profiler trace per rank, markers that
tie gloo's worker threads to mesh axes, the bytes of every collective, and a per-rank summary
(memory, step times, data-parallel bytes) beside the trace - apart from the training loop so
that :class:`partita.train.worker.Trainer` reads as training, and the profiling as profiling.
"""
from __future__ import annotations

import json
import resource
from pathlib import Path

import torch
import torch.distributed as dist


def start_profiler(profile_dir: str | None, device: torch.device, rank: int, steps: int):
    """torch.profiler over all but the first step (warm-up), one Chrome trace per rank."""
    if not profile_dir or steps < 2:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    out = Path(profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    # on accelerators, record_shapes lets c10d record each collective's process group
    # (record_param_comms "Process Group Ranks"); gloo records none (see mark_process_groups)
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps - 1),
                   record_shapes=device.type != "cpu", on_trace_ready=lambda p: p.export_chrome_trace(str(out / f"rank{rank}.json")))
    prof.start()
    return prof


def mark_process_groups(pm) -> None:
    """Name the process groups' worker threads in the trace: gloo runs each group's
    collectives on the group's own threads and records no group, so a few tiny
    all-reduces per group inside a ``partita:group:<axis>`` annotation tie those threads
    to the mesh axis (:func:`partita.analyze.breakdown.analyze_trace` leaves the annotation's
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


def start_counter(pm, profile_dir: str | None):
    """Under ``partita profile``: count every collective's bytes (the traces miss PowerSGD's,
    :mod:`partita.profile.collective_counter`), with DDP's built-in reduction routed where it is counted."""
    if not profile_dir:
        return None
    from ..profile.collective_counter import CollectiveCounter, route_builtin_ddp_reduction
    route_builtin_ddp_reduction(pm.modules)
    return CollectiveCounter().start()


def dp_wire(pm, counter) -> dict:
    """This rank's data-parallel collectives per step (bytes, calls, seconds) from step
    START_ITER on (PowerSGD compresses from there; the group markers run before)."""
    if counter is None or pm.dp_group is None:
        return {}
    from ..runtime.compression import START_ITER
    counter.stop()
    return {"first_step": START_ITER, "group": dist.get_process_group_ranks(pm.dp_group),
            "by_collective": counter.per_step(tuple(dist.get_process_group_ranks(pm.dp_group)), START_ITER)}


def write_profile_summary(profile_dir: str, rank: int, device: torch.device, times: list[float],
                          dp_wire: dict | None = None) -> None:
    """Per-rank memory and step times beside the trace (allocator figures where the device has
    them), and the data-parallel bytes the counter saw (``dp_wire``)."""
    summary: dict = {"rank": rank, "device": device.type, "step_times_s": times, "dp_wire": dp_wire or {}}
    if device.type != "cpu":
        module = getattr(torch, device.type)
        summary["peak_allocated_gib"] = module.max_memory_allocated(device) / 2 ** 30
        summary["peak_reserved_gib"] = module.max_memory_reserved(device) / 2 ** 30
        summary["fragmentation"] = 1 - summary["peak_allocated_gib"] / max(summary["peak_reserved_gib"], 1e-9)
    else:
        summary["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    (Path(profile_dir) / f"rank{rank}.summary.json").write_text(json.dumps(summary))
