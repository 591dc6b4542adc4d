"""Trace analysis: compute vs communication, overlap, exposed communication and idle time.

Works on Chrome traces written by ``torch.profiler`` (Kineto), also ones recorded
elsewhere, without importing torch:

* accelerator traces: device events (``cat`` kernel / gpu_memcpy / gpu_memset) on the
  device's streams; collective kernels are recognised by name (``ncclKernel_*``,
  ``ncclDevKernel_*``, HCCL ``hcom_*``); everything else on the device is compute
  (memcpy/memset are reported apart);
* CPU traces (gloo): there are no device streams; collectives run as ``gloo:<op>`` events
  on gloo's worker threads and ``c10d::<op>_`` on the calling thread; compute is the
  top-level ``cpu_op`` events of the training threads that are not collectives.

Each category is reduced to a union of time intervals, so nested or concurrent events
count once. Then, over the analysed window:
``overlapped = |compute ∩ comm|``, ``exposed comm = |comm \\ compute|``,
``idle = window - |compute ∪ comm ∪ memory|``. Per collective kind (all_reduce,
all_gather, reduce_scatter, all_to_all, broadcast, send/recv, barrier) the union of its
intervals is reported too. The window is the ProfilerStep annotations when present,
else the span of all analysed events.
"""
from __future__ import annotations

import re
from pathlib import Path

from .events import (
    CPU_COMM, DEVICE_CATS, DEVICE_COMM, EP_COMM, Interval, TraceBreakdown, clip, collective_kind,
    intersect, length, load_trace, subtract, union,
)


def _events(trace: dict) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _collective_launchers(trace: dict) -> dict:
    """correlation id -> name of the c10d/nccl op whose runtime call launched the kernel."""
    events = _events(trace)
    ops: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and CPU_COMM.search(str(e.get("name", ""))) and "record_param" not in e["name"]:
            ops.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out = {}
    if not ops:
        return out
    for e in events:
        if e.get("cat") != "cuda_runtime" and e.get("cat") != "cuda_driver":
            continue
        corr = e.get("args", {}).get("correlation")
        for op in ops.get((e.get("pid"), e.get("tid")), ()):
            if op["ts"] <= e["ts"] <= op["ts"] + op["dur"]:
                out[corr] = op["name"]
                if op["name"].startswith("c10d::"):
                    break
    return out


def _group_of(event: dict) -> str | None:
    """The global ranks of the event's process group ("0,2"), when its arguments say."""
    ranks = event.get("args", {}).get("Process Group Ranks")
    if ranks is None:
        return None
    found = re.findall(r"\d+", str(ranks))
    return ",".join(found) if found else None


GROUP_MARKER = "partita:group:"


def _marked_thread_axes(events: list[dict]) -> tuple[dict[tuple, str], list[Interval]]:
    """(pid, tid) of gloo worker threads -> the mesh axis whose marker collectives ran on
    them, and the markers' own intervals (left out of the analysis)."""
    markers = [e for e in events if str(e.get("name", "")).startswith(GROUP_MARKER)]
    threads: dict[tuple, str] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if not str(e.get("name", "")).startswith("gloo:"):
            continue
        for m in markers:
            if m["ts"] <= e["ts"] <= m["ts"] + m["dur"]:
                threads[(e.get("pid"), e.get("tid"))] = m["name"][len(GROUP_MARKER):]
    return threads, [(float(m["ts"]), float(m["ts"]) + float(m["dur"])) for m in markers]


def analyze_trace(trace: dict | str | Path) -> TraceBreakdown:
    """Compute/communication/overlap split of one rank's trace."""
    if not isinstance(trace, dict):
        trace = load_trace(trace)
    from .ascend import analyze_ascend, is_ascend
    if is_ascend(trace):
        return analyze_ascend(trace)
    events = _events(trace)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    compute: list[Interval] = []
    comm: list[Interval] = []
    memory: list[Interval] = []
    by_kind: dict[str, list[Interval]] = {}
    by_group: dict[str, list[Interval]] = {}
    by_axis: dict[str, list[Interval]] = {}
    if device:
        kind = "device"
        launched_by = _collective_launchers(trace)
        for e in device:
            iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            name = str(e.get("name", ""))
            if e["cat"] != "kernel":
                memory.append(iv)
            elif DEVICE_COMM.search(name) or EP_COMM.search(name):
                comm.append(iv)
                # NCCL runs all-to-all as SendRecv kernels: name the collective after the
                # c10d op that launched the kernel when the trace links them
                launcher = launched_by.get(e.get("args", {}).get("correlation"))
                by_kind.setdefault(collective_kind(launcher or name), []).append(iv)
                group = _group_of(e)
                if group:
                    by_group.setdefault(group, []).append(iv)
            else:
                compute.append(iv)
        if steps:
            # device work of a step can run past its CPU-side annotation: extend to the last kernel
            window = [(min(a for a, _ in steps), max(max(b for _, b in steps), max(b for _, b in compute + comm + memory)))]
        else:
            window = [(min(a for a, _ in compute + comm + memory), max(b for _, b in compute + comm + memory))]
    else:
        kind = "cpu"
        cpu = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation") or str(e.get("name", "")).startswith("gloo:")]
        comm_events = [e for e in cpu if CPU_COMM.search(str(e.get("name", "")))]
        comm_threads = {(e.get("pid"), e.get("tid")) for e in comm_events if str(e["name"]).startswith("gloo:")}
        thread_axis, markers = _marked_thread_axes(events)
        for e in comm_events:
            iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            comm.append(iv)
            by_kind.setdefault(collective_kind(str(e["name"])), []).append(iv)
            thread = (e.get("pid"), e.get("tid"))
            if thread in thread_axis:
                by_axis.setdefault(thread_axis[thread], []).append(iv)
        for e in cpu:
            if e.get("cat") != "cpu_op" or CPU_COMM.search(str(e.get("name", ""))):
                continue
            if (e.get("pid"), e.get("tid")) in comm_threads:
                continue
            compute.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        spans = compute + comm
        window = steps if steps else ([(min(a for a, _ in spans), max(b for _, b in spans))] if spans else [(0.0, 0.0)])
        window = subtract(window, markers) if markers else window
    compute_u, comm_u, memory_u = clip(compute, window), clip(comm, window), clip(memory, window)
    overlapped = length(intersect(compute_u, comm_u))
    busy = length(union(compute_u + comm_u + memory_u))
    win = length(union(window))
    by_kind_u = {k: clip(v, window) for k, v in sorted(by_kind.items())}
    timeline = {"compute": compute_u, "memory": memory_u, **{f"comm:{k}": v for k, v in by_kind_u.items()}}
    return TraceBreakdown(
        kind=kind, window_us=win, compute_us=length(compute_u), communication_us=length(comm_u),
        overlapped_us=overlapped, exposed_communication_us=length(comm_u) - overlapped, memory_us=length(memory_u),
        idle_us=win - busy, by_collective_us={k: length(v) for k, v in by_kind_u.items()},
        steps=len(steps), timeline={k: v for k, v in timeline.items() if v},
        by_group_us={k: length(clip(v, window)) for k, v in sorted(by_group.items())},
        by_axis_us={k: length(clip(v, window)) for k, v in sorted(by_axis.items())})
