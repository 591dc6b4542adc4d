"""Holistic Trace Analysis's conventions, re-stated so ``partita analyze --conventions hta``
gives HTA 0.5.0's figures without pandas (HTA: github.com/facebookresearch/HolisticTraceAnalysis,
MIT; the rules below are read from its ``hta/common/trace_parser.py``, ``trace.py``,
``trace_filter.py``, ``utils/utils.py`` and ``analyzers/{breakdown,communication}_analysis.py``
at 0.5.0 and checked against the installed package by ``tests/test_analyze.py``).

1. **Timestamp rounding.** When a trace's timestamps are fractional (Kineto >= 2.4 writes
   nanosecond resolution, so ``ts`` is a float), every event becomes
   ``[ceil(ts), floor(ts + dur)]`` - HTA's fix for events that overlap by a few ns
   (pytorch/pytorch#122425). Integer-``ts`` traces are left alone.
2. **What is a GPU event.** An event with an integer ``args.stream >= 0`` and an
   ``args.correlation >= 0`` (kernels, memcpy, memset), plus the ``Event Sync`` /
   ``Context Sync`` events. Events without ``dur`` or ``cat`` are dropped.
3. **The window: the last profiler step is dropped.** When the traces hold at least two
   distinct ``ProfilerStep#N`` names, each rank keeps its CPU events that start before its
   last ``ProfilerStep`` starts, and only the GPU events launched by those (same
   ``correlation``). Without steps nothing is filtered.
4. **Kernel kinds, by name.** Communication: ``^nccl.*Kernel``; memory: ``^Memcpy``,
   ``^Memset``, ``^dma``; computation: anything else that does not contain ``Memcpy`` or
   ``Sync`` (and does not start with ``Memset``); the rest is "other" (e.g. ``Event Sync``).
5. **Temporal breakdown** over the events with ``stream != -1``: ``kernel_time`` = from the
   first start to the last end; ``idle`` = ``kernel_time`` minus the union of all of them
   (gaps when no stream runs anything); ``compute`` = the union of computation kernels;
   ``non_compute`` = the rest (communication, memory, other not hidden under compute).
   Percentages are of ``kernel_time``, rounded to 2 decimals.
6. **Overlap** = ``|compute ∪ ∩ communication ∪| / |communication ∪|`` (HTA's
   ``comp_comm_overlap_pctg``: the share of communication time hidden under computation).
7. **Idle time per stream** (``get_idle_time_breakdown``): on each stream, kernels sorted by
   start; each gap to the previous kernel's end is *host wait* when the launching runtime
   call started after that end, *kernel wait* when shorter than 30 (``consecutive_kernel_delay``),
   else *other*.
"""
from __future__ import annotations

import math
import re
from collections import Counter

from ..errors import PartitaError
from .breakdown import _group_of
from .events import intersect, length

COMM_RE = re.compile(r"^nccl.*Kernel")
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_NAMES = ("Event Sync", "Context Sync")
KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")
CONSECUTIVE_KERNEL_DELAY = 30


def kernel_type(name: str) -> str:
    """HTA's ``get_kernel_type``: communication, memory, computation or other (rule 4)."""
    if COMM_RE.match(name):
        return "communication"
    if MEMORY_RE.match(name):
        return "memory"
    if not NOT_COMPUTE_RE.match(name):
        return "computation"
    return "other"


def _int_arg(args: dict, key: str) -> int:
    """An integer argument, -1 when absent or not a number (HTA's defaults)."""
    try:
        return int(args.get(key, -1))
    except (TypeError, ValueError):
        return -1


def normalise_events(trace: dict, rounding: bool | None = None) -> list[dict]:
    """Rules 1-2: the events HTA keeps, as ``{name, cat, ts, end, stream, corr, gpu}``
    (``rounding``: None = HTA's rule, else forced on or off)."""
    raw = trace["traceEvents"]
    if rounding is None:
        rounding = any(isinstance(e.get("ts"), float) or e.get("ts") is None for e in raw)
    out = []
    for e in raw:
        dur, cat = e.get("dur"), e.get("cat")
        if dur is None or cat is None or cat == "Trace" or e.get("ts") is None:
            continue
        ts, end = float(e["ts"]), float(e["ts"]) + float(dur)
        if rounding:
            ts, end = float(math.ceil(ts)), float(math.floor(end))
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        stream, corr, name = _int_arg(args, "stream"), _int_arg(args, "correlation"), str(e.get("name", ""))
        out.append({"name": name, "cat": str(cat), "ts": ts, "end": end, "stream": stream, "corr": corr,
                    "gpu": (stream >= 0 and corr >= 0) or name in SYNC_NAMES,
                    "group": _group_of(e) if "Process Group Ranks" in args else None})
    return out


def step_names(events: list[dict]) -> set[str]:
    return {e["name"] for e in events if "ProfilerStep" in e["name"]}


def drop_last_step(events: list[dict], all_step_names: set[str], path: str) -> list[dict]:
    """Rule 3: CPU events before the last step's start, and the GPU events they launched
    (repeated once per matching CPU event, as HTA's inner join does)."""
    if len(all_step_names) < 2:
        return events
    cpu = [e for e in events if not e["gpu"]]
    starts = [e["ts"] for e in cpu if e["name"] in all_step_names]
    if not starts:
        raise PartitaError(f"{path} has no ProfilerStep annotation while the other traces do: HTA's "
                           "conventions keep the steps before the last one; give traces of the same run")
    last = max(starts)
    kept_cpu = [e for e in cpu if e["ts"] < last]
    launches = Counter(e["corr"] for e in kept_cpu)
    kept_gpu = [e for e in events if e["gpu"] for _ in range(launches.get(e["corr"], 0))]
    return kept_gpu + kept_cpu


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """HTA's ``merge_kernel_intervals``: sorted by start, a new interval begins when a start
    is later than every earlier end."""
    out: list[tuple[float, float]] = []
    running_end = -math.inf
    for ts, end in sorted(intervals):
        if out and ts <= running_end:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((ts, end))
        running_end = max(running_end, end)
    return out


def temporal_breakdown(events: list[dict], path: str) -> dict:
    """Rules 4-6 on one rank's kept events (microseconds and HTA's percentages)."""
    kernels = [e for e in events if e["stream"] != -1]
    if not kernels:
        raise PartitaError(f"{path} has no GPU kernels (events with a stream) in the analysed steps: HTA's "
                           "conventions need a GPU/NPU trace; use --conventions partita for CPU traces")
    merged = merge([(e["ts"], e["end"]) for e in kernels])
    kernel_time = merged[-1][1] - merged[0][0]
    idle = kernel_time - length(merged)
    kinds = {k: merge([(e["ts"], e["end"]) for e in kernels if kernel_type(e["name"]) == k])
             for k in ("computation", "communication", "memory")}
    compute = length(kinds["computation"])
    comm = length(kinds["communication"])
    overlap = float(length(intersect(kinds["computation"], kinds["communication"])))

    def pct(x: float) -> float:
        return round(100 * x / kernel_time, 2) if kernel_time else 0.0
    return {"kernel_time_us": kernel_time, "idle_us": idle, "compute_us": compute,
            "non_compute_us": kernel_time - compute - idle, "communication_us": comm,
            "memory_us": length(kinds["memory"]), "overlapped_us": overlap,
            "idle_pct": pct(idle), "compute_pct": pct(compute), "non_compute_pct": pct(kernel_time - compute - idle),
            "overlap_pct": round(100 * overlap / comm, 2) if comm else None}


def idle_by_stream(events: list[dict], delay: float = CONSECUTIVE_KERNEL_DELAY) -> dict[int, dict]:
    """Rule 7 per stream: idle microseconds split into host wait, kernel wait and other."""
    runtime_ts: dict[int, float] = {}
    for e in events:
        if not e["gpu"] and e["corr"] >= 0:
            runtime_ts[e["corr"]] = e["ts"]
    streams: dict[int, list[dict]] = {}
    for e in events:
        if e["stream"] != -1 and e["cat"] in KERNEL_CATS:
            streams.setdefault(e["stream"], []).append(e)
    out = {}
    for stream, kernels in streams.items():
        kernels.sort(key=lambda e: e["ts"])
        split = {"host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0}
        for prev, cur in zip(kernels, kernels[1:]):
            gap = cur["ts"] - prev["end"]
            launched = runtime_ts.get(cur["corr"])
            if launched is not None and launched > prev["end"]:
                split["host_wait_us"] += gap
            elif gap < delay:
                split["kernel_wait_us"] += gap
            else:
                split["other_us"] += gap
        out[stream] = {"idle_us": sum(split.values()), **split}
    return out


def analyze_hta(traces: list[tuple[str, dict]]) -> list[dict]:
    """Per rank (in the order given), the temporal breakdown, overlap and idle time per
    stream under HTA's conventions, and the communication kernels it counted (for the
    by-collective split, which HTA does not make); the traces are analysed together because the step
    filter looks at the step names of all of them (HTA's shared symbol table)."""
    normalised = [(path, normalise_events(trace)) for path, trace in traces]
    names: set[str] = set()
    for _, events in normalised:
        names |= step_names(events)
    out = []
    for path, events in normalised:
        kept = drop_last_step(events, names, path)
        comm = [e for e in kept if e["stream"] != -1 and kernel_type(e["name"]) == "communication"]
        out.append({**temporal_breakdown(kept, path), "idle_by_stream": idle_by_stream(kept),
                    "communication_kernels": comm})
    return out
