"""``partita analyze``: where the time went in profiler traces recorded by anyone.

Input: torch.profiler / Kineto Chrome traces (``torch_npu.profiler`` writes the same
format) from Megatron-LM, torchtitan, DeepSpeed or a plain training loop - one file per
rank, or a directory (:mod:`partita.analyze.files` reads them, with one-line errors
and a size limit). Output, per rank: compute / non-compute / idle and the share of
communication overlapped with compute; communication by collective, by process group and
by the parallel axis the group serves (:mod:`partita.analyze.groups`); idle time per
stream; memory peaks and fragmentation where ``[memory]`` events were recorded
(:mod:`partita.analyze.memory`); and across ranks, the stragglers.

Two sets of definitions (docs/profile.md compares them):

* ``partita`` (default): :func:`partita.analyze.breakdown.analyze_trace`, the analysis
  ``partita profile`` uses - every profiled step is kept, the window runs from the first
  step's start to the last device event, timestamps are not rounded, Ascend's HCCL
  kernels count as communication, memcpy/memset apart;
* ``hta``: Holistic Trace Analysis 0.5.0's (:mod:`partita.analyze.hta`) - the last
  profiler step is dropped, the window is the first to the last kernel, fractional
  timestamps are rounded inward to whole microseconds, kernels classified by HTA's name
  patterns. ``tests/test_analyze.py`` checks these against the HTA package itself.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Iterable

from ..errors import PartitaError
from .files import DEFAULT_MAX_MB, RankTrace, load_rank_traces
from .groups import communication_by_axis, process_groups
from .hta import analyze_hta, idle_by_stream, normalise_events
from .ascend import read_memory_record, read_msprof_outputs
from .memory import memory_timeline
from .breakdown import TraceBreakdown, _collective_launchers, analyze_trace, collective_kind, length, union

CONVENTIONS = ("partita", "hta")


def _pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


def _partita_rank(rt: RankTrace, b: TraceBreakdown) -> dict:
    """One rank under Partita's definitions, in the shape both conventions share."""
    if b.kind != "device":
        # a CPU (gloo) trace: analyze_trace's CPU rules, there are no streams
        streams: dict = {}
    elif b.ascend is not None:
        # torch_npu: the window minus each stream's merged tasks (HCCL's tasks overlap each other)
        streams = b.ascend["idle_by_stream"]
    else:
        streams = idle_by_stream(normalise_events(rt.trace, rounding=False))
    non_compute = b.window_us - b.compute_us - b.idle_us
    return {"window_us": b.window_us, "steps": b.steps, "compute_us": b.compute_us, "non_compute_us": non_compute,
            "communication_us": b.communication_us, "memory_us": b.memory_us, "idle_us": b.idle_us,
            "overlapped_us": b.overlapped_us, "exposed_communication_us": b.exposed_communication_us,
            "compute_pct": _pct(b.compute_us, b.window_us), "non_compute_pct": _pct(non_compute, b.window_us),
            "idle_pct": _pct(b.idle_us, b.window_us),
            "overlap_pct": _pct(b.overlapped_us, b.communication_us) if b.communication_us else None,
            "idle_by_stream": streams}


def _ascend_extras(rt: RankTrace, b: TraceBreakdown) -> dict:
    """For a torch_npu capture: Partita's per-step figures in msprof's columns, and msprof's
    own summaries beside them (``step_trace_time.csv``, ``communication.json``, ...)."""
    out: dict = {}
    if b.ascend is not None:
        out["ascend"] = {k: v for k, v in b.ascend.items() if k != "idle_by_stream"}
    if rt.msprof_dir:
        msprof = read_msprof_outputs(rt.msprof_dir)
        msprof.pop("memory_record", None)
        out["msprof"] = msprof
    return out


def _memory(rt: RankTrace) -> dict:
    """``[memory]`` events of the trace; for a torch_npu capture, ``memory_record.csv``."""
    if rt.msprof_dir and (Path(rt.msprof_dir) / "memory_record.csv").is_file():
        record = read_memory_record(Path(rt.msprof_dir) / "memory_record.csv")
        if record:
            return record
    if rt.msprof_dir and (record := read_msprof_outputs(rt.msprof_dir).get("memory_record")):
        return record  # the export_type=db capture's MEMORY_RECORD table
    return memory_timeline(rt.trace)


def _hta_communication(kernels: list[dict], launchers: dict) -> dict:
    """By collective and by process group, over the communication kernels HTA counted
    (NCCL's SendRecv kernels named after the c10d op that launched them, as in
    :func:`partita.analyze.breakdown.analyze_trace`)."""
    by_kind: dict[str, list] = {}
    by_group: dict[str, list] = {}
    for k in kernels:
        kind = collective_kind(launchers.get(k["corr"]) or k["name"])
        by_kind.setdefault(kind, []).append((k["ts"], k["end"]))
        if k["group"]:
            by_group.setdefault(k["group"], []).append((k["ts"], k["end"]))
    return {"by_collective_us": {k: length(union(v)) for k, v in sorted(by_kind.items())},
            "by_group_us": {k: length(union(v)) for k, v in sorted(by_group.items())}}


def _hta_rank(h: dict, b: TraceBreakdown) -> dict:
    """One rank under HTA's definitions (the window is HTA's kernel_time)."""
    return {"window_us": h["kernel_time_us"], "steps": max(b.steps - 1, 0) if b.steps > 1 else b.steps,
            "compute_us": h["compute_us"], "non_compute_us": h["non_compute_us"],
            "communication_us": h["communication_us"], "memory_us": h["memory_us"], "idle_us": h["idle_us"],
            "overlapped_us": h["overlapped_us"],
            "exposed_communication_us": h["communication_us"] - h["overlapped_us"],
            "compute_pct": h["compute_pct"], "non_compute_pct": h["non_compute_pct"], "idle_pct": h["idle_pct"],
            "overlap_pct": h["overlap_pct"], "idle_by_stream": h["idle_by_stream"]}


def _world(trace: dict) -> int | None:
    info = trace.get("distributedInfo")
    size = info.get("world_size") if isinstance(info, dict) else None
    return size if isinstance(size, int) else None


def stragglers(ranks: list[dict]) -> dict:
    """Across ranks: the slowest by busy compute and by window, against the median.

    In synchronous training every rank waits for the slowest at each collective, so a
    straggler shows as *more compute* and *less communication* than the others (the
    others' communication kernels sit waiting for it - HTA's ``get_potential_stragglers``
    reads the same signal)."""
    if not ranks:
        return {}
    def by(key: str) -> dict:
        values = {r["rank"]: r[key] for r in ranks}
        median = statistics.median(values.values())
        slowest = max(values, key=values.get)
        return {"rank": slowest, "us": values[slowest], "median_us": median,
                "ratio_to_median": round(values[slowest] / median, 3) if median else None}
    comm = {r["rank"]: r["communication_us"] for r in ranks}
    least = min(comm, key=comm.get) if comm else None
    # the verdict: where every rank communicates, the one that communicates least is the one
    # the others wait for inside the collectives (a rank's all-reduce lasts from its own
    # arrival to the last rank's); without communication, the one that computes most
    if len(ranks) > 1 and all(v > 0 for v in comm.values()):
        verdict = {"rank": least, "signal": "least communication (the others wait for it in the collectives)"}
    else:
        verdict = {"rank": by("compute_us")["rank"], "signal": "most compute"}
    return {"compute": by("compute_us"), "window": by("window_us"), "least_communication_rank": least,
            "straggler": verdict}


def analyze_traces(inputs: Iterable[str], conventions: str = "partita", max_mb: int = DEFAULT_MAX_MB,
                   loaded: list[RankTrace] | None = None) -> tuple[dict, dict]:
    """The report and each rank's timeline intervals (for the HTML page)."""
    if conventions not in CONVENTIONS:
        raise PartitaError(f"unknown conventions {conventions!r}: use one of {', '.join(CONVENTIONS)}")
    rank_traces = loaded if loaded is not None else load_rank_traces(list(inputs), max_mb)
    partita = [analyze_trace(rt.trace) for rt in rank_traces]
    hta = analyze_hta([(rt.path, rt.trace) for rt in rank_traces]) if conventions == "hta" else None
    ranks, timelines = [], {}
    for i, (rt, b) in enumerate(zip(rank_traces, partita)):
        comm = {"by_collective_us": b.by_collective_us, "by_group_us": b.by_group_us}
        if hta:
            comm = _hta_communication(hta[i]["communication_kernels"], _collective_launchers(rt.trace))
        figures = _hta_rank(hta[i], b) if hta else _partita_rank(rt, b)
        groups = process_groups(rt.trace)
        axes = b.by_axis_us if b.by_axis_us and not hta else communication_by_axis(comm["by_group_us"], groups,
                                                                                  _world(rt.trace))
        ranks.append({"rank": rt.rank, "path": rt.path, "kind": b.kind, **figures, **comm, "by_axis_us": axes,
                      "groups": groups, "memory": _memory(rt), **_ascend_extras(rt, b)})
        timelines[rt.rank] = b.timeline
    report = {"conventions": conventions, "ranks": ranks, "stragglers": stragglers(ranks),
              "world_size": _world(rank_traces[0].trace) if rank_traces else None}
    return report, timelines
