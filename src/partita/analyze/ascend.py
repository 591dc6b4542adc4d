"""torch_npu / msprof captures read the way msprof reads them (issue 35).

A torch_npu profiler run writes, per rank, a ``{host}_{pid}_{ts}_ascend_pt`` folder (the
msinsight test data names them ``rank<N>_ascend_pt``) holding ``profiler_info_<rank>.json``
(the rank and the profiler's configuration) and ``ASCEND_PROFILER_OUTPUT/`` with
``trace_view.json`` (a Chrome trace) and msprof's own summaries: ``step_trace_time.csv``
(Computing, Communication(Not Overlapped), Overlapped, Free per step), ``kernel_details.csv``,
``op_statistic.csv``, ``memory_record.csv`` and, from profiler Level1, ``communication.json``
and ``communication_matrix.json``.

In ``trace_view.json`` (the layout of CANN 7/8, 2024-2025):

* ``Ascend Hardware``: one thread per device stream (``Stream N``), every task with
  ``args["Task Type"]`` - ``AI_CORE``, ``AI_VECTOR_CORE``, ``MIX_AIV``, ``AI_CPU``, ``DSA_SQE``
  (computation), ``EVENT_WAIT_SQE`` / ``EVENT_RECORD_SQE`` (stream synchronisation: a compute
  stream waiting for HCCL sits in one ``EVENT_WAIT`` for the whole all-reduce),
  ``PCIE_DMA_SQE`` / ``SDMA_SQE`` (``MEMCPY_ASYNC``), and HCCL's own tasks on HCCL's
  streams: ``Notify Wait``, ``Write Value``, ``SDMA``; older CANN writes ``Other`` as the
  task type of every task, and HCCL runs on several streams (``NOTIFY_WAIT``,
  ``REDUCE_ASYNC_V2``, ``MEMCPY_ASYNC`` on a main stream and its slave streams).
* ``HCCL``: one thread per communication group (``Group 0 Communication``) holding the
  collective operations themselves (``hcom_allReduce__868_0_1``, with ``alg_type``,
  ``count``, ``data_type``), and from Level1 ``Plane N`` threads with their sub-tasks.
* ``Overlap Analysis``: msprof's own verdict as lanes (``Computing``, ``Communication``,
  ``Communication(Not Overlapped)``, ``Free``) - what ``step_trace_time.csv`` sums.
* flow events ``torch_to_npu`` (``cat: async_npu``) from the launching host op to the
  device task (and to the HCCL operation).

What Partita takes from them, per rank (:func:`analyze_ascend`):

* **stream roles**: a stream that carries any HCCL task (notify / write-value / reduce /
  ``SDMA`` task types or names, or an ``hcom_*`` op) is a *communication* stream: all its
  tasks are communication (an ``EVENT_WAIT`` or ``MEMCPY_ASYNC`` there is part of the
  collective). On the other (*compute*) streams, a task is *wait* (event/notify records
  and waits, placeholders), *memory* (DMA / SDMA copies) or *compute* by its task type,
  by its name only where the task type says ``Other``;
* **communication** = the union of the HCCL operations of the ``HCCL`` process (what msprof
  counts as Communication), or, on captures without that process, of the communication
  streams' tasks; by collective from the operations' names (``hcom_allReduce_`` ->
  all_reduce);
* **the step** as msprof defines it on the device: for each ``ProfilerStep#N``, from the
  first to the last compute task or HCCL operation launched (by the ``torch_to_npu``
  flows) from host code inside that step; without flows, the span of the Overlap Analysis
  lanes; without those, the host step extended to its last device task (the old rule);
* per step and over all steps: ``computing`` = |compute|, ``communication`` = |comm|,
  ``overlapped`` = |compute ∩ comm|, not overlapped = the rest of comm, ``free`` = window -
  |compute ∪ comm| - msprof's four columns. Memory copies outside both count as free, as
  msprof counts them (reported apart as ``memory_us``); so do the compute streams' waits
  (``wait_us``);
* idle per stream: the window minus the union of the stream's tasks (tasks that overlap
  each other merged, so never negative);
* msprof's own lanes over the same window (``overlap_lanes_us``), to read beside them.

The msprof files are read too (:func:`read_msprof_outputs`), and put beside Partita's
figures in the report.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from .events import Interval, TraceBreakdown, collective_kind, intersect, length, union, with_bandwidth

HARDWARE = "Ascend Hardware"
HCCL = "HCCL"
OVERLAP = "Overlap Analysis"
#: task types (or names, on CANN that writes "Other") that only HCCL issues
HCCL_TASK = re.compile(r"^(NOTIFY|WRITE_VALUE|REDUCE_ASYNC|REDUCE_INLINE|RDMA|SDMA$|HCOM|HCCL)")
WAIT_TASK = re.compile(r"^(EVENT_|PLACE_HOLDER|PROFILING_|CAPTURE_|STARS_COMMON|BARRIER|MODEL_)|WAIT")
MEMORY_TASK = re.compile(r"^(PCIE_DMA|SDMA_SQE|MEMCPY|MEMCOPY|MEMSET)")
STEP = re.compile(r"^ProfilerStep#(\d+)")


def is_ascend(trace: dict) -> bool:
    return HARDWARE in _process_names(trace).values()


def _process_names(trace: dict) -> dict:
    return {e.get("pid"): e["args"].get("name") for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "process_name" and isinstance(e.get("args"), dict)}


def _thread_names(trace: dict) -> dict:
    return {(e.get("pid"), e.get("tid")): str(e["args"].get("name")) for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "thread_name" and isinstance(e.get("args"), dict)}


def _label(e: dict) -> str:
    """The task's type, or its name where the type is missing or ``Other``."""
    tt = str(e.get("args", {}).get("Task Type") or "")
    label = tt if tt and tt.lower() != "other" else str(e.get("name", ""))
    return label.upper().replace(" ", "_")


def task_class(e: dict) -> str:
    """``hccl``, ``wait``, ``memory`` or ``compute`` for one ``Ascend Hardware`` task."""
    label, name = _label(e), str(e.get("name", "")).lower()
    if HCCL_TASK.search(label) or name.startswith(("hcom_", "hccl")):
        return "hccl"
    if WAIT_TASK.search(label):
        return "wait"
    if MEMORY_TASK.search(label):
        return "memory"
    return "compute"


def _stream_of(e: dict, threads: dict) -> int:
    found = re.search(r"\d+", threads.get((e.get("pid"), e.get("tid")), "") or str(e.get("tid")))
    return int(found.group()) if found else 0


def _iv(e: dict) -> Interval:
    return (float(e["ts"]), float(e["ts"]) + float(e["dur"]))


def _launch_times(trace: dict) -> dict:
    """(pid, tid, ts) of a device task / HCCL op -> the time its host op launched it,
    from the ``torch_to_npu`` flow events (``s`` at the launch, ``f`` bound to the task)."""
    starts, ends = {}, []
    for e in trace.get("traceEvents", []):
        if e.get("cat") != "async_npu" or e.get("ts") is None:
            continue
        if e.get("ph") == "s":
            starts[e.get("id")] = float(e["ts"])
        elif e.get("ph") == "f":
            ends.append(e)
    return {(e.get("pid"), e.get("tid"), float(e["ts"])): starts[e.get("id")] for e in ends if e.get("id") in starts}


def _clip(intervals: list[Interval], window: list[Interval]) -> list[Interval]:
    return intersect(union(intervals), union(window))


def _figures(window: list[Interval], compute: list[Interval], comm: list[Interval]) -> dict:
    """msprof's four columns over ``window`` (intervals already merged)."""
    c, m = _clip(compute, window), _clip(comm, window)
    overlapped = length(intersect(c, m))
    win = length(union(window))
    return {"window_us": win, "computing_us": length(c), "communication_us": length(m),
            "overlapped_us": overlapped, "communication_not_overlapped_us": length(m) - overlapped,
            "free_us": win - length(union(c + m))}


def _device_tasks(hardware: list[dict], classes: list[str], streams: list[int], comm_streams: set[int]) -> dict:
    """The ``Ascend Hardware`` tasks as intervals by role: everything on a stream that carries
    HCCL tasks is communication (its waits and copies too); elsewhere each task by its class."""
    out: dict = {"compute": [], "memory": [], "wait": [], "stream_comm": [], "per_stream": {}}
    for e, c, s in zip(hardware, classes, streams):
        iv = _iv(e)
        out["per_stream"].setdefault(s, []).append(iv)
        if s in comm_streams or c not in ("compute", "memory", "wait"):
            out["stream_comm"].append(iv)
        else:
            out[c].append(iv)
    return out


def _collectives(ops: list[dict], hardware: list[dict], streams: list[int], comm_streams: set[int],
                 stream_comm: list[Interval]) -> tuple[list[Interval], dict[str, list[Interval]]]:
    """Communication intervals and their split by collective: the HCCL process's operations
    (what msprof counts) where the capture has them, else the tasks of the HCCL streams."""
    by_kind: dict[str, list[Interval]] = {}
    if ops:
        for e in ops:
            by_kind.setdefault(collective_kind(str(e.get("name", ""))), []).append(_iv(e))
        return [_iv(e) for e in ops], by_kind
    for e, s in zip(hardware, streams):
        if s in comm_streams and str(e.get("name", "")).lower().startswith(("hcom_", "hccl")):
            by_kind.setdefault(collective_kind(str(e["name"])), []).append(_iv(e))
    if stream_comm and not by_kind:
        by_kind["other"] = list(stream_comm)
    return stream_comm, by_kind


def _launched_steps(trace: dict, events: list[dict], members: list[dict],
                    ops: list[dict]) -> tuple[list[tuple[int, Interval]], list[tuple[int | None, Interval]]]:
    """(host ProfilerSteps, device step windows): each step's window spans the device tasks
    launched from inside it (``torch_to_npu`` flows); an HCCL operation the flows do not link
    (older captures link the tasks only) joins the step whose span it starts in."""
    host_steps = sorted((int(STEP.match(str(e["name"])).group(1)), _iv(e)) for e in events
                        if STEP.match(str(e.get("name", ""))))
    launched = _launch_times(trace)
    steps: list[tuple[int | None, Interval]] = []
    for number, (lo, hi) in host_steps:
        inside = [_iv(e) for e in members
                  if lo <= launched.get((e.get("pid"), e.get("tid"), float(e["ts"])), -1.0) <= hi]
        if inside:
            steps.append((number, (min(a for a, _ in inside), max(b for _, b in inside))))
    unlinked = [_iv(e) for e in ops if (e.get("pid"), e.get("tid"), float(e["ts"])) not in launched]
    for i, (number, (lo, hi)) in enumerate(steps):
        ends = [b for a, b in unlinked if lo <= a <= hi]
        steps[i] = (number, (lo, max([hi, *ends])))
    return host_steps, steps


def _fallback_steps(events: list[dict], processes: dict, host_steps: list[tuple[int, Interval]],
                    device: list[Interval]) -> tuple[list[tuple[int | None, Interval]], str]:
    """The step window of a capture without launch flows: the Overlap Analysis lanes, else the
    host ProfilerSteps stretched to the last device task, else the span of the device tasks."""
    lanes = [_iv(e) for e in events if processes.get(e.get("pid")) == OVERLAP]
    if lanes:
        return ([(host_steps[0][0] if len(host_steps) == 1 else None,
                  (min(a for a, _ in lanes), max(b for _, b in lanes)))], "the Overlap Analysis lanes")
    if host_steps and device:
        last = max(b for _, b in device)
        return ([(n, (lo, max(hi, last) if i == len(host_steps) - 1 else hi)) for i, (n, (lo, hi)) in enumerate(host_steps)],
                "the host ProfilerStep annotations, to the last device task")
    if device:
        return [(None, (min(a for a, _ in device), max(b for _, b in device)))], "the span of the device tasks"
    return [], "the span of the device tasks"


def analyze_ascend(trace: dict) -> TraceBreakdown:
    """The breakdown of one torch_npu ``trace_view.json`` (already normalised by
    :func:`partita.analyze.files.normalise_npu_trace`); see the module docstring."""
    processes, threads = _process_names(trace), _thread_names(trace)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and e.get("ts") is not None]
    hardware = [e for e in events if processes.get(e.get("pid")) == HARDWARE]
    hccl = [e for e in events if processes.get(e.get("pid")) == HCCL]
    ops = [e for e in hccl if "communication" in threads.get((e.get("pid"), e.get("tid")), "").lower()]
    if not ops:
        ops = [e for e in hccl if str(e.get("name", "")).lower().startswith(("hcom_", "hccl"))]
    classes = [task_class(e) for e in hardware]
    streams = [_stream_of(e, threads) for e in hardware]
    comm_streams = {s for s, c in zip(streams, classes) if c == "hccl"}
    tasks = _device_tasks(hardware, classes, streams, comm_streams)
    compute, memory, wait = tasks["compute"], tasks["memory"], tasks["wait"]
    comm, by_kind = _collectives(ops, hardware, streams, comm_streams, tasks["stream_comm"])

    members = [e for e, c, s in zip(hardware, classes, streams) if c == "compute" and s not in comm_streams]
    members += ops if ops else [e for e, s in zip(hardware, streams) if s in comm_streams]
    host_steps, steps = _launched_steps(trace, events, members, ops)
    source = "device tasks launched in each ProfilerStep"
    if not steps:
        steps, source = _fallback_steps(events, processes, host_steps, compute + comm + memory + wait)
    window = union([w for _, w in steps])
    compute_u, comm_u = _clip(compute, window), _clip(comm, window)
    memory_u, wait_u = _clip(memory, window), _clip(wait, window)
    total = _figures(window, compute_u, comm_u)
    by_kind_u = {k: _clip(v, window) for k, v in sorted(by_kind.items())}
    timeline = {"compute": compute_u, "memory": memory_u, "wait": wait_u,
                **{f"comm:{k}": v for k, v in by_kind_u.items()}}
    b = TraceBreakdown(
        kind="device", window_us=total["window_us"], compute_us=total["computing_us"],
        communication_us=total["communication_us"], overlapped_us=total["overlapped_us"],
        exposed_communication_us=total["communication_not_overlapped_us"], memory_us=length(memory_u),
        idle_us=total["free_us"], by_collective_us={k: length(v) for k, v in by_kind_u.items()}, steps=len(steps),
        timeline={k: v for k, v in timeline.items() if v})
    b.ascend = _ascend_extras(events, processes, threads, window, steps, source, compute_u, comm_u, wait_u,
                              tasks["per_stream"], comm_streams, len(ops))
    return b


def _ascend_extras(events: list[dict], processes: dict, threads: dict, window: list[Interval],
                   steps: list, source: str, compute_u: list[Interval], comm_u: list[Interval],
                   wait_u: list[Interval], per_stream: dict[int, list[Interval]], comm_streams: set[int],
                   hccl_operations: int) -> dict:
    """What only a torch_npu capture has: msprof's columns per step, the waits, each stream's
    role and idle time (never negative: its tasks are merged first), and msprof's own
    Overlap Analysis lanes over the same window."""
    win = length(union(window))
    idle_by_stream = {}
    for s, ivs in sorted(per_stream.items()):
        busy = length(_clip(ivs, window))
        idle_by_stream[s] = {"role": "communication" if s in comm_streams else "compute",
                             "busy_us": busy, "idle_us": max(win - busy, 0.0)}
    lanes: dict[str, list[Interval]] = {}
    for e in events:
        if processes.get(e.get("pid")) == OVERLAP:
            lanes.setdefault(threads.get((e.get("pid"), e.get("tid")), str(e.get("tid"))), []).append(_iv(e))
    per_step = [{"step": n, "start_us": w[0], **_figures([w], compute_u, comm_u)} for n, w in steps]
    return {"step_window": source, "per_step": per_step, "wait_us": length(wait_u),
            "overlap_lanes_us": {k: length(_clip(v, window)) for k, v in sorted(lanes.items())},
            "communication_streams": sorted(comm_streams), "idle_by_stream": idle_by_stream,
            "hccl_operations": hccl_operations}


# --- msprof's own files ------------------------------------------------------------------------

def _float(value) -> float | None:
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return None


def _csv_rows(path: Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in csv.DictReader(f)]
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def read_step_trace_time(path: Path) -> list[dict]:
    """``step_trace_time.csv``: per step, msprof's Computing / Communication(Not Overlapped) /
    Overlapped / Communication / Free / Stage (us)."""
    out = []
    for row in _csv_rows(path):
        fields = {"computing_us": "Computing", "communication_not_overlapped_us": "Communication(Not Overlapped)",
                  "overlapped_us": "Overlapped", "communication_us": "Communication", "free_us": "Free",
                  "window_us": "Stage", "bubble_us": "Bubble", "preparing_us": "Preparing"}
        values = {k: _float(row.get(v)) for k, v in fields.items()}
        if values["computing_us"] is None:
            continue
        step = row.get("Step", "")
        out.append({"step": int(step) if step.isdigit() else step or None, **values})
    return out


def read_communication(path: Path) -> dict:
    """``communication.json``: elapsed time per collective kind (us), summed over its
    operations, per step and overall, with the transports' sizes and times."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    by_kind: dict[str, float] = {}
    transport: dict[str, dict] = {}
    operations = 0
    for step in doc.values() if isinstance(doc, dict) else []:
        for part in ("collective", "p2p"):
            for name, op in (step.get(part) or {}).items() if isinstance(step, dict) else []:
                if name.startswith("Total") or not isinstance(op, dict):
                    continue
                info = op.get("Communication Time Info") or {}
                elapse = _float(info.get("Elapse Time(ms)"))
                if elapse is None:
                    continue
                operations += 1
                kind = collective_kind(name.split("@")[0])
                by_kind[kind] = by_kind.get(kind, 0.0) + elapse * 1e3
                for link, bw in (op.get("Communication Bandwidth Info") or {}).items():
                    t = transport.setdefault(link, {"size_mb": 0.0, "time_ms": 0.0})
                    t["size_mb"] += _float(bw.get("Transit Size(MB)")) or 0.0
                    t["time_ms"] += _float(bw.get("Transit Time(ms)")) or 0.0
    transport = with_bandwidth(transport)
    return {"operations": operations, "by_collective_us": dict(sorted(by_kind.items())), "transport": transport}


def read_communication_matrix(path: Path) -> dict:
    """``communication_matrix.json``: bytes and bandwidth per (source, destination) link,
    summed over the operations (the ``total`` entries msprof adds are skipped)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    links: dict[str, dict] = {}
    for step in doc.values() if isinstance(doc, dict) else []:
        for name, op in ((step or {}).get("collective") or {}).items() if isinstance(step, dict) else []:
            if "total" in name.lower() or not isinstance(op, dict):
                continue
            for link, v in op.items():
                if not isinstance(v, dict):
                    continue
                t = links.setdefault(link, {"transport": v.get("Transport Type"), "size_mb": 0.0, "time_ms": 0.0})
                t["size_mb"] += _float(v.get("Transit Size(MB)")) or 0.0
                t["time_ms"] += _float(v.get("Transit Time(ms)")) or 0.0
    return {k: {**v, "bandwidth_gb_s": round(v["size_mb"] / v["time_ms"], 3) if v["time_ms"] else None}
            for k, v in sorted(links.items())}


def read_kernel_details(path: Path) -> dict:
    """``kernel_details.csv``: how many device kernels msprof lists and their total time."""
    rows = _csv_rows(path)
    durations = [_float(r.get("Duration(us)")) for r in rows]
    durations = [d for d in durations if d is not None]
    return {"kernels": len(durations), "duration_us": sum(durations)} if rows else {}


def read_op_statistic(path: Path, top: int = 5) -> list[dict]:
    """``op_statistic.csv``: the ``top`` operator types by total device time."""
    rows = []
    for r in _csv_rows(path):
        total = _float(r.get("Total Time(us)"))
        if total is not None:
            rows.append({"op_type": r.get("OP Type"), "core": r.get("Core Type"), "count": int(_float(r.get("Count")) or 0),
                         "total_us": total})
    return sorted(rows, key=lambda r: -r["total_us"])[:top]


def read_memory_record(path: Path) -> dict[str, dict]:
    """``memory_record.csv`` per device, in :func:`partita.analyze.memory.memory_timeline`'s shape:
    the PyTorch allocator's rows (component ``PTA``; ``PTA+GE`` or ``APP`` where absent)
    give allocated and reserved, so fragmentation (reserved - allocated) over time; the
    ``APP`` rows (the whole process on the device) give ``app_peak_reserved_bytes``."""
    from .memory import component_peaks
    series: dict[str, dict[str, list]] = {}
    for r in _csv_rows(path):
        t = _float(r.get("Timestamp(us)"))
        if t is None:
            continue
        device = (r.get("Device Type") or "NPU").lower()
        alloc, reserved = _float(r.get("Total Allocated(MB)")), _float(r.get("Total Reserved(MB)"))
        series.setdefault(device, {}).setdefault(r.get("Component", ""), []).append(
            (t, (alloc or 0.0) * 2**20, (reserved or 0.0) * 2**20))
    app = {device: max(p[2] for p in parts["APP"]) for device, parts in series.items() if parts.get("APP")}
    return component_peaks(series, "memory_record.csv ({})", app)


def read_msprof_outputs(output_dir: str | Path) -> dict:
    """Whatever of msprof's summaries ``ASCEND_PROFILER_OUTPUT`` holds."""
    d = Path(output_dir)
    readers = {"step_trace_time": ("step_trace_time.csv", read_step_trace_time),
               "communication": ("communication.json", read_communication),
               "communication_matrix": ("communication_matrix.json", read_communication_matrix),
               "kernel_details": ("kernel_details.csv", read_kernel_details),
               "op_statistic": ("op_statistic.csv", read_op_statistic),
               "memory_record": ("memory_record.csv", read_memory_record)}
    out = {}
    for key, (name, reader) in readers.items():
        if (d / name).is_file():
            value = reader(d / name)
            if value:
                out[key] = value
    if not out:  # the export_type=db capture: the same summaries from analysis.db and the profiler db
        from .ascend_db import read_db_outputs
        out = read_db_outputs(d)
    return out
